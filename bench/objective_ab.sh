#!/usr/bin/env bash
# Behaviour-unchanged check for refactors of the objective wiring (issue 43): runs one short job
# of each objective (the tiny default, velocity, guided, flow, trajectory with roll-out, dmd with
# GAN and regression terms, a LoRA student, student.shard gradients and parameters) with one
# binary, and writes OUT/<case>.txt: every step's loss as metrics.jsonl prints it, then the
# sha256 of every file of RUN/student; the `plan` case writes `plan --json` of several jobs
# (OUT/plan.txt). Two OUT folders from two binaries are then compared with `diff -r`: equal files
# mean bit-identical loss curves, bit-identical students and the same plans.
# Usage: bash bench/objective_ab.sh OUT [CASE ...]   (WAN_DISTILL=build/src/app/wan-distill)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/objective_ab.sh OUT [CASE ...]}
shift
bin=${WAN_DISTILL:-$PWD/build/src/app/wan-distill}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/wd-ab.XXXXXX")
trap 'rm -rf "$work"' EXIT
export WD_KILL_GRACE=1

run() {  # run NAME RANKS ARGS...: one job, its losses and its student's hashes into OUT/NAME.txt
  local name=$1 ranks=$2
  shift 2
  local dir=$work/$name
  echo "objective_ab: $name" >&2
  bash launch/mpirun.sh -np "$ranks" "$bin" train --run-dir "$dir" --log.level warn "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log" >&2; echo "objective_ab: $name failed" >&2; return 1; }
  {
    python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r: print(r.get("step"), repr(r["loss"]), repr(r.get("critic_loss", "")))' "$dir/metrics.jsonl"
    # Every file's hash; in the JSON files this run's temporary directory is written as WORK (a
    # LoRA folder's lora.json names its base by path).
    (cd "$dir/student" && find . -type f | sort | while read -r f; do
      if [[ $f == *.json ]]; then printf '%s  %s\n' "$(sed "s|$work|WORK|g" "$f" | sha256sum | cut -d' ' -f1)" "$f"
      else sha256sum "$f"; fi
    done)
  } >"$out/$name.txt"
}

# The builtin tiny teacher and data set, made once and shared by every case.
assets=$work/assets
[[ " $* " == " plan " ]] || bash launch/mpirun.sh -np 3 "$bin" train --run-dir "$assets" --train.steps 1 --log.level warn >"$work/assets.log" 2>&1 ||
  { cat "$work/assets.log" >&2; exit 1; }
a="--teacher.checkpoint $assets/cache/tiny-teacher --data.path $assets/cache/tiny-data.h5"
fp32="--teacher.compute fp32 --train.log_every 1 --train.seed 5"
guided="--train.objective guided --teacher.guidance 4 $fp32 --train.steps 12"
traj="--train.objective trajectory --teacher.guidance 3 --teacher.steps 6 --student.steps 3 --teacher.shift 3 $fp32 --train.steps 8 --train.eval_samples 12"
dmd="--train.objective dmd --teacher.guidance 3 --student.steps 2 --teacher.shift 3 $fp32 --train.steps 10 --train.eval_samples 12"

plans() {  # plan --json (no timing: --calibrate no) of the example configs and of each objective's keys
  local p="$bin plan --run-dir $work/plan --calibrate no --json"
  local gpu="--np 16 --gpus-per-node 8 --gpu-memory 180GiB"
  {
    $p --cpu --np 3
    $p --cpu --np 3 --train.objective guided --student.lora_rank 4
    $p --cpu --np 3 --train.objective trajectory --train.trajectory_rollout 0.5 --student.shard gradients
    $p --cpu --np 3 --train.objective dmd --critic.gan_weight 0.01 --train.gan_weight 0.003 --critic.dim 32 --critic.init random
    $p --config configs/wan22-ti2v-5b.ini --preset wan22-ti2v-5b $gpu --latent 48,21,44,80
    $p --config configs/wan22-t2v-a14b.ini --preset wan22-t2v-a14b $gpu --train.objective trajectory --student.lora_rank 64 --student.checkpointing all --student.precision bf16-mixed --latent 16,21,90,160
    $p --config configs/wan22-t2v-a14b.ini --preset wan22-t2v-a14b $gpu --train.objective dmd --student.lora_rank 64 --student.shard gradients --student.checkpointing all --latent 16,21,60,104
  } >"$work/plan.json" 2>"$work/plan.log" || { cat "$work/plan.log" >&2; return 1; }
  # The memory plans and the recommendation; the speed part holds this host's measured matmul rate.
  python3 -c 'import json,sys
text = open(sys.argv[1]).read()
dec, i = json.JSONDecoder(), 0
while True:
    i = text.find("{", i)
    if i < 0: break
    obj, i = dec.raw_decode(text, i)
    obj.pop("speed", None)
    print(json.dumps(obj, indent=1, sort_keys=True))' "$work/plan.json" >"$out/plan.txt"
}

cases=("$@")
if ((${#cases[@]} == 0)); then
  cases=(tiny velocity guided guided-colocated flow trajectory dmd dmd-colocated lora shard-gradients shard-parameters plan)
fi
for c in "${cases[@]}"; do
  case $c in
    tiny) run tiny 3 --train.steps 20 --train.log_every 1 ;;
    velocity) run velocity 3 $a $fp32 --train.steps 12 ;;
    guided) run guided 3 $a $guided ;;
    guided-colocated) run guided-colocated 2 $a $guided --teacher.placement colocated ;;
    flow) run flow 3 --train.objective flow --teacher.ranks 0 --train.cond_dropout 0.1 --train.log_every 1 --train.steps 20 --train.eval_samples 6 ;;
    trajectory) run trajectory 3 $a $traj --train.trajectory_rollout 0.5 ;;
    dmd) run dmd 3 $a $dmd --train.dmd_regression_weight 0.5 --teacher.steps 4 --critic.gan_weight 0.01 --train.gan_weight 0.003 --critic.gan_block 0 ;;
    dmd-colocated) run dmd-colocated 2 $a $dmd --teacher.placement colocated ;;
    lora) run lora 3 $a $guided --student.lora_rank 4 ;;
    shard-gradients) run shard-gradients 3 $a $fp32 --train.steps 12 --student.shard gradients ;;
    shard-parameters) run shard-parameters 3 $a $fp32 --train.steps 12 --student.shard parameters --student.checkpointing all ;;
    plan) plans ;;
    *) echo "objective_ab: unknown case $c" >&2; exit 2 ;;
  esac
done
echo "objective_ab: ${#cases[@]} case(s) in $out" >&2
