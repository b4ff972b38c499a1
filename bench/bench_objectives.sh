#!/usr/bin/env bash
# The objectives' bench (docs/objectives.md#the-bench): a classes data set, a teacher trained on it
# with train.objective flow, and the teacher's samples of the held-out contexts scored: guided
# (the reference), unguided, and guided at few steps (what a user runs instead of a distilled
# student), then a guidance-distilled student (train.objective guided, initialised from the
# teacher) sampled with no guidance. Writes OUT_DIR/summary.json and prints a table.
# Usage: bash bench/bench_objectives.sh [OUT_DIR]   (BUILD_DIR=build, STEPS=8000, GUIDANCE=2, K=4,
#        SHIFT_K=3, GUIDED_STEPS=1500 (0: none), SKIP_TRAIN=1 to reuse OUT_DIR/teacher-run/student,
#        SKIP_GUIDED=1 to reuse OUT_DIR/guided-run/student, TRAJ_STEPS=1500 (0: none), SKIP_TRAJ=1 to reuse
#        OUT_DIR/traj-run, TRAJ_EVERY=250: the student of every such checkpoint is sampled for the curve)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/${BUILD_DIR:-build}/src/app/wan-distill
out=${1:-${BUILD_DIR:-build}/bench-objectives}
steps=${STEPS:-8000}
g=${GUIDANCE:-2}
guided_steps=${GUIDED_STEPS:-1500}
k=${K:-4}
shift_k=${SHIFT_K:-3}
py=${PYTHON:-$PWD/.venv/bin/python}
mkdir -p "$out"
cd "$out"

# 6 classes of 16x1x16x16 latents, 8 context rows of 64; the last 192 samples are held out.
[[ -f classes.h5 ]] || "$bin" make-dataset --output classes.h5 --kind classes --classes 6 --samples 4288 \
  --latent 16,1,16,16 --text-len 8 --text-dim 64 --seed 1
if [[ -z ${SKIP_TRAIN:-} ]]; then
  start=$SECONDS
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
    --run-dir teacher-run --data.path classes.h5 --train.objective flow --teacher.ranks 0 --train.cond_dropout 0.1 \
    --student.dim 128 --student.ffn_dim 512 --student.num_heads 4 --student.num_layers 4 \
    --train.batch_size 16 --train.eval_samples 192 --train.steps "$steps" --train.lr 1e-3 --train.warmup_steps 200 \
    --train.log_every 200 --train.eval_every 2000 --checkpoint.every 2000 --runtime.threads 1 --student.device cpu \
    > teacher.log 2>&1
  echo "teacher trained in $((SECONDS - start)) s ($steps steps)"
fi
held_out=4096-4287
sample() {  # NAME STEPS GUIDANCE SHIFT SOLVER
  "$bin" sample --teacher.checkpoint teacher-run/student --data.path classes.h5 --samples "$held_out" \
    --steps "$2" --guidance "$3" --shift "$4" --solver "$5" --seed 7 --output "rows/$1" --runtime.threads 2 \
    --log.level warn
}
sample reference 40 "$g" 3 unipc
sample teacher_unguided 40 1 3 unipc
sample teacher_at_k "$k" "$g" "$shift_k" euler
# Guidance distillation: a copy of the teacher (every block and tensor) learns the guided target,
# each of 2 ranks with its own teacher (colocated), and samples with one forward a step.
if ((guided_steps > 0)); then
  if [[ -z ${SKIP_GUIDED:-} ]]; then
    start=$SECONDS
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
      --run-dir guided-run --teacher.checkpoint teacher-run/student --data.path classes.h5 \
      --train.objective guided --teacher.guidance "$g" --teacher.placement colocated --teacher.compute fp32 \
      --student.dim 128 --student.ffn_dim 512 --student.num_heads 4 --student.num_layers 4 \
      --student.init teacher-blocks:0,1,2,3 --train.batch_size 16 --train.eval_samples 192 \
      --train.steps "$guided_steps" --train.lr 3e-4 --train.warmup_steps 50 --train.log_every 100 \
      --train.eval_every 500 --runtime.threads 1 --student.device cpu > guided.log 2>&1
    echo "guided student trained in $((SECONDS - start)) s ($guided_steps steps)"
  fi
  "$bin" sample --teacher.checkpoint guided-run/student --data.path classes.h5 --samples "$held_out" --steps 40 \
    --guidance 1 --shift 3 --seed 7 --output rows/guided_student --runtime.threads 2 --log.level warn
fi
# Trajectory distillation: a copy of the teacher learns the jumps of the guided teacher's 40-step
# UniPC paths between its own k σ (shift SHIFT_K), every trajectory from fresh noise, each of 2
# ranks sampling its own (colocated); sampled with k Euler steps and no guidance. Every
# TRAJ_EVERY steps a checkpoint's student is sampled too: the curve of error against trajectories.
traj_steps=${TRAJ_STEPS:-1500}
traj_every=${TRAJ_EVERY:-250}
if ((traj_steps > 0)); then
  if [[ -z ${SKIP_TRAJ:-} ]]; then
    start=$SECONDS
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
      --run-dir traj-run --teacher.checkpoint teacher-run/student --data.path classes.h5 \
      --train.objective trajectory --teacher.guidance "$g" --teacher.steps 40 --teacher.shift "$shift_k" \
      --student.steps "$k" --teacher.placement colocated --teacher.compute fp32 \
      --student.dim 128 --student.ffn_dim 512 --student.num_heads 4 --student.num_layers 4 \
      --student.init teacher-blocks:0,1,2,3 --train.batch_size 16 --train.eval_samples 192 \
      --train.steps "$traj_steps" --train.lr 2e-4 --train.warmup_steps 50 --train.log_every 50 \
      --checkpoint.every "$traj_every" --checkpoint.keep 0 --runtime.threads 1 --student.device cpu > traj.log 2>&1
    echo "trajectory student trained in $((SECONDS - start)) s ($traj_steps steps)"
  fi
  for ck in traj-run/checkpoints/step-*; do
    step=$((10#${ck##*step-}))
    "$bin" sample --teacher.checkpoint "$ck/student" --data.path classes.h5 --samples "$held_out" --steps "$k" \
      --guidance 1 --shift "$shift_k" --solver euler --seed 7 --output "rows/trajectory_student-$step" \
      --runtime.threads 2 --log.level warn
  done
fi
# Other noise, the same contexts: the reference's second sample set, so that a paired match
# earns nothing against it.
"$bin" sample --teacher.checkpoint teacher-run/student --data.path classes.h5 --samples "$held_out" --steps 40 \
  --guidance "$g" --shift 3 --seed 8 --output rows/reference_other --runtime.threads 2 --log.level warn

"$py" - "$g" "$k" <<'PY'
import json, sys
import torch
from safetensors.torch import load_file

g, k = sys.argv[1], sys.argv[2]
import os
names = ["reference", "teacher_unguided", "teacher_at_k"] + (["guided_student"] if os.path.isdir("rows/guided_student") else [])
final = {n: load_file(f"rows/{n}/latents.safetensors")["teacher"] for n in names + ["reference_other"]}
ref = final["reference"]
rows = {}
for name in names:
    x = final[name]
    err = ((x - ref) ** 2).flatten(1).sum(1)
    norm = (ref ** 2).flatten(1).sum(1)
    report = json.load(open(f"rows/{name}/report.json"))["teacher"]
    rows[name] = {"paired_rel_mse": float(err.sum() / norm.sum()),
                  "paired_rel_mse_median": float((err / norm).median()),
                  "class_accuracy": report["class_accuracy"], "strict_accuracy": report["strict_accuracy"]}
other = json.load(open("rows/reference_other/report.json"))["teacher"]
rows["reference_other_noise"] = {"class_accuracy": other["class_accuracy"], "strict_accuracy": other["strict_accuracy"]}
json.dump({"guidance": float(g), "k": int(k), "rows": rows}, open("summary.json", "w"), indent=2)
print(f"{'row':<24} {'paired rel MSE':>14} {'median':>8} {'class %':>8} {'strict %':>9}")
for name, r in rows.items():
    print(f"{name:<24} {r.get('paired_rel_mse', float('nan')):>14.4f} {r.get('paired_rel_mse_median', float('nan')):>8.4f} "
          f"{100 * r['class_accuracy']:>8.1f} {100 * r['strict_accuracy']:>9.1f}")
PY
