#!/usr/bin/env bash
# bench_throughput.sh: samples/s, student wait, CPU seconds per sample and summed peak RSS / PSS
# of `wan-distill train` in each layout a 3-rank job can take, beside the replicated-teacher
# PyTorch baseline (bench/replicated_baseline.py: every rank holds the teacher, DDP students),
# on the two configs of issue 13, and the planner's predicted samples/s and pick for each layout
# (`wan-distill plan --cpu --np 3 --json`), `train --teacher.layout auto` (the layout it picks
# at start-up) and 1 teacher + 2 students with `--teacher.micro_batch auto`, with each teacher
# rank's busy share. Prints one markdown table per config. A row that is not a planner candidate
# (the whole batch where the planner gives a micro-batch; two teacher threads) shows the
# planner's figure for its layout in brackets, unscored.
#
#   bench/bench_throughput.sh [tiny-64|small|all]
#
# Environment:
#   WD_BIN    the wan-distill binary (default: build/src/app/wan-distill)
#   WORK_DIR  teachers, data sets and run directories (default /tmp/wd-bench-throughput)
#   STEPS     optimizer steps per run (default: 300 for tiny-64, logged every 25; 15 for small,
#             logged every 5: samples/s and wait are the windows after the first, CPU s/sample
#             the whole run)
#   BASELINE  0 skips the PyTorch baseline (it needs .venv with torch: bash launch/setup.sh cuda)
# Every run uses 3 ranks through launch/mpirun.sh (one BLAS thread each unless
# runtime.*threads say otherwise) and the same data, noise, student shapes and batch.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
which=${1:-all}
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-throughput}
case "$which" in tiny-64 | small | all) ;; *) echo "usage: bench/bench_throughput.sh [tiny-64|small|all]" >&2; exit 2 ;; esac
[[ -x $bin ]] || { echo "bench_throughput.sh: $bin not found; build wan-distill first or set WD_BIN" >&2; exit 1; }
mkdir -p "$work"

# config NAME: sets teacher/data/student arguments of the named shapes (issue 13).
config() {
  case "$1" in
    tiny-64)
      teacher_args=(--preset tiny --dtype bf16)  # dim 128, ffn 256, 4 heads, 4 blocks, text 16 x 64
      data_args=(--latent 16,1,16,16 --text-len 16 --text-dim 64 --samples 160)
      student=(--student.dim 64 --student.ffn_dim 128 --student.num_heads 4 --student.num_layers 2)
      # A step is ~25 ms: 300 steps make windows of a second or more (40 steps, timed in
      # windows of 5, moved by 10% from one run of the same layout to the next).
      batch=4 steps=${STEPS:-300} eval=24 window=25
      ;;
    small)
      teacher_args=(--preset tiny --dim 512 --ffn-dim 1024 --num-heads 8 --num-layers 8 --text-dim 256
                    --text-len 32 --dtype bf16)
      data_args=(--latent 16,2,32,32 --text-len 32 --text-dim 256 --samples 64)
      student=(--student.dim 256 --student.ffn_dim 512 --student.num_heads 4 --student.num_layers 4)
      batch=2 steps=${STEPS:-15} eval=12 window=5
      ;;
  esac
}

# micro_of LAYOUT: the teacher micro-batch the planner gives LAYOUT (plan.json of this config).
micro_of() {
  python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["speed"]["layouts"]
print(next(r["micro_batch"] for r in rows if r["layout"] == sys.argv[2]))' "$work/$cfg/plan.json" "$1"
}

# run NAME CONFIG FLAGS...: one 3-rank training run; its summary row goes to rows.
run() {
  local name=$1 cfg=$2
  shift 2
  local dir=$work/$cfg/$name
  rm -rf "$dir"
  mkdir -p "$dir"
  local cmd=(bash "$repo/launch/mpirun.sh" -np 3 "$bin" train --run-dir "$dir"
             --teacher.checkpoint "$work/$cfg/teacher" --data.path "$work/$cfg/data.h5" "${student[@]}"
             --train.steps "$steps" --train.batch_size "$batch" --train.eval_samples "$eval"
             --train.log_every "$window" --memory.report_every "$window" "$@")
  echo "bench_throughput.sh: ${cmd[*]}" >&2
  "${cmd[@]}" > "$dir/log.txt" 2>&1 || { tail -20 "$dir/log.txt" >&2; exit 1; }
  echo "${cmd[*]}" > "$dir/command.txt"
  rows+=("$dir")
}

for cfg in tiny-64 small; do
  [[ $which == all || $which == "$cfg" ]] || continue
  config "$cfg"
  mkdir -p "$work/$cfg"
  [[ -f $work/$cfg/teacher/config.json ]] ||
    "$bin" init-teacher "${teacher_args[@]}" --output "$work/$cfg/teacher" --log.level warn
  [[ -f $work/$cfg/data.h5 ]] || "$bin" make-dataset "${data_args[@]}" --seed 0 --output "$work/$cfg/data.h5" --log.level warn
  # The planner's speed prediction for every layout of 3 ranks on this host (rates measured now).
  plan_cmd=("$bin" plan --cpu --np 3 --teacher.checkpoint "$work/$cfg/teacher" --data.path "$work/$cfg/data.h5"
            "${student[@]}" --train.batch_size "$batch" --json --log.level warn)
  echo "bench_throughput.sh: ${plan_cmd[*]}" >&2
  "${plan_cmd[@]}" > "$work/$cfg/plan.json"
  rows=()
  # The planner's candidates, each with the teacher micro-batch the planner gives it.
  run dedicated "$cfg" --teacher.placement cpu --teacher.ranks 1 --teacher.micro_batch "$(micro_of "1 teacher(s) + 2 student(s)")"
  run colocated "$cfg" --teacher.placement colocated --teacher.micro_batch "$(micro_of "colocated x3")"
  run shard-2 "$cfg" --teacher.placement shard --teacher.ranks 2 \
    --teacher.micro_batch "$(micro_of "1 replica(s) x 2 stages + 1 student(s)")"
  # Beside them: the whole batch at once, two threads for the teacher, the micro-batch timed at
  # start-up, and the layout train picks for itself.
  run dedicated-whole-batch "$cfg" --teacher.placement cpu --teacher.ranks 1 --teacher.micro_batch 0
  run dedicated-teacher2t "$cfg" --teacher.placement cpu --teacher.ranks 1 --runtime.teacher_threads 2
  run dedicated-micro-auto "$cfg" --teacher.placement cpu --teacher.ranks 1 --teacher.micro_batch auto
  run layout-auto "$cfg" --teacher.layout auto
  baselines=()
  for dtype in bf16 fp32; do
    [[ ${BASELINE:-1} != 0 && -x $repo/.venv/bin/torchrun ]] || break
    out=$work/$cfg/baseline-$dtype.json
    echo "bench_throughput.sh: torchrun --standalone --nproc_per_node 3 bench/replicated_baseline.py --config $cfg --steps $steps --teacher-dtype $dtype" >&2
    if OMP_NUM_THREADS=1 "$repo/.venv/bin/torchrun" --standalone --nproc_per_node 3 "$repo/bench/replicated_baseline.py" \
      --config "$cfg" --steps "$steps" --teacher-dtype "$dtype" --out "$out" > "$work/$cfg/baseline-$dtype.log" 2>&1; then
      baselines+=("$out")
    else
      tail -20 "$work/$cfg/baseline-$dtype.log" >&2
    fi
  done
  python3 - "$cfg" "$work/$cfg/plan.json" "${baselines[*]}" "${rows[@]}" <<'PY'
import json, sys
cfg, plan_file, baselines, dirs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
speed = json.load(open(plan_file))["speed"]
predicted = {l["layout"]: l for l in speed["layouts"]}
pick = speed["layouts"][0]["layout"]
layout_of = {"dedicated": "1 teacher(s) + 2 student(s)", "dedicated-teacher2t": "1 teacher(s) + 2 student(s)",
             "dedicated-micro-auto": "1 teacher(s) + 2 student(s)", "dedicated-whole-batch": "1 teacher(s) + 2 student(s)",
             "colocated": "colocated x3", "shard-2": "1 replica(s) x 2 stages + 1 student(s)"}
base = {json.load(open(b))["teacher_dtype"]: json.load(open(b)) for b in baselines}
print(f"\n### {cfg}\n")
sizes = ", ".join(f"{r['size']} a forward {r['s_per_sample']:.3f}" for r in speed.get("teacher_by_size", []))
print(f"Planner (measured at the start: teacher forward s/sample by size: {sizes}; student step "
      f"{speed['student_s_per_sample']:.3f} s/sample): pick **{pick}** (`{speed['layouts'][0]['flags']}`).\n")
print("| layout | samples/s | x baseline bf16 | x baseline fp32 | predicted samples/s (error) | student wait % (predicted) "
      "| teacher busy % | CPU s/sample | summed peak RSS MiB | summed peak PSS MiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def rel(sps, dtype):
    return f"{sps / base[dtype]['samples_per_s']:.2f}" if dtype in base else "-"
for dtype, b in base.items():
    print(f"| replicated-teacher PyTorch baseline, {dtype} teacher | {b['samples_per_s']:.2f} | {rel(b['samples_per_s'], 'bf16')} "
          f"| {rel(b['samples_per_s'], 'fp32')} | - | - | - | {b['cpu_s_per_sample']:.2f} | {b['peak_rss_bytes_sum'] / 2**20:.0f} "
          f"| {b['pss_bytes_sum'] / 2**20:.0f} |")
for d in dirs:
    name = d.rsplit("/", 1)[1]
    s = json.load(open(f"{d}/summary.json"))
    students = [r for r in s["ranks"] if r["role"] == "student"]
    samples = sum(r["samples"] for r in students)
    # Steady state, as the baseline's timed steps: the log windows after the first (start-up,
    # first evaluation); each window holds the same number of samples, so the rate is their
    # harmonic mean, the wait their mean.
    windows = [m for m in map(json.loads, open(f"{d}/metrics.jsonl")) if "samples_per_s" in m][1:]
    sps = len(windows) / sum(1 / w["samples_per_s"] for w in windows)
    wait = 100 * sum(w["wait_fraction"] for w in windows) / len(windows)
    # Each teacher rank's busy share of its loop (reading, noising, forward); shard stages
    # listed in stage order. A colocated job has no teacher ranks.
    busy = "/".join(f"{100 * r['busy_fraction']:.0f}" for r in s["ranks"] if r["role"] == "teacher") or "-"
    if name == "dedicated-micro-auto":  # chosen at start-up by timing
        name += f" (chose {json.load(open(f'{d}/micro_batch.json'))['micro_batch']})"
    elif name in ("dedicated", "colocated", "shard-2"):
        p = predicted[layout_of[name]]
        name += f" (micro_batch {p['micro_batch']})"
    if name == "layout-auto":  # the layout train chose at start-up from its own timing
        chosen = json.load(open(f"{d}/layout.json"))
        layout_of[name] = chosen["layout"]
        name = f"layout-auto ({chosen['flags']})"
    p = predicted.get(layout_of[d.rsplit("/", 1)[1]])
    # The planner predicts each layout with its own micro-batch: a row run otherwise is not
    # what it predicted (its "error" shows what the micro-batch is worth).
    pred = f"{p['samples_per_s']:.2f} ({100 * (p['samples_per_s'] / sps - 1):+.0f}%)" if p else "-"
    pwait = f"{100 * p['student_wait']:.0f}" if p else "-"
    label = f"**{name}** (planner's pick)" if p and p["layout"] == pick and name.split()[0] in ("dedicated", "colocated", "shard-2") else name
    if name.startswith("dedicated-whole-batch") and p["micro_batch"] > 0:
        pred = f"({p['samples_per_s']:.2f} with micro_batch {p['micro_batch']})"
    if name.startswith("dedicated-teacher2t"):  # the model gives a rank at most one core
        pred = f"({p['samples_per_s']:.2f} with one thread)"
    print(f"| {label} | {sps:.2f} | {rel(sps, 'bf16')} | {rel(sps, 'fp32')} | {pred} | {wait:.0f} ({pwait}) "
          f"| {busy} | {s['cpu_seconds'] / samples:.2f} | {s['peak_rss_bytes_sum'] / 2**20:.0f} | {s['peak_pss_bytes_sum'] / 2**20:.0f} |")
PY
done
