#!/usr/bin/env bash
# student.shard optimizer (ZeRO-1) and gradients (ZeRO-2) against plain data-parallel on the CPU
# `small` job (the bench_throughput.sh config: a dim-512, 8-block teacher, a dim-256, 4-block
# student) with 2 and 4 students and one teacher rank, gradient buckets of 1 MB (the student's
# 14.5 MiB of gradients in 15): per-rank weights, gradients and AdamW bytes from the memory
# report (metrics.jsonl), bytes per parameter against the formulas (16 unsharded, 8 + 8/N with
# optimizer, 4 + 12/N with gradients, fp32), `plan`'s sum of the three for the same job,
# samples/s, and whether the loss curves agree.
#   bench/bench_sharding.sh            (WD_BIN, WORK_DIR, STEPS override; ~7 min on 2 cores)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-sharding}
steps=${STEPS:-30}
[[ -x $bin ]] || { echo "bench_sharding.sh: $bin not found; build wan-distill first or set WD_BIN" >&2; exit 1; }
mkdir -p "$work"
[[ -f $work/teacher/config.json ]] ||
  "$bin" init-teacher --preset tiny --dim 512 --ffn-dim 1024 --num-heads 8 --num-layers 8 --text-dim 256 \
    --text-len 32 --dtype bf16 --output "$work/teacher" --log.level warn
[[ -f $work/data.h5 ]] ||
  "$bin" make-dataset --latent 16,2,32,32 --text-len 32 --text-dim 256 --samples 96 --seed 0 \
    --output "$work/data.h5" --log.level warn
common=(--teacher.checkpoint "$work/teacher" --data.path "$work/data.h5" --teacher.placement cpu --teacher.ranks 1
        --student.dim 256 --student.ffn_dim 512 --student.num_heads 4 --student.num_layers 4
        --train.batch_size 2 --train.eval_samples 16 --train.log_every 1 --memory.report_every 10
        --comm.bucket_mb 1)

for students in 2 4; do
  for shard in none optimizer gradients; do
    dir=$work/s$students-$shard
    rm -rf "$dir"
    cmd=(bash "$repo/launch/mpirun.sh" -np $((students + 1)) "$bin" train --run-dir "$dir" "${common[@]}"
         --train.steps "$steps" --student.shard "$shard")
    echo "bench_sharding.sh: ${cmd[*]}" >&2
    "${cmd[@]}" > "$work/s$students-$shard.log" 2>&1 || { tail -20 "$work/s$students-$shard.log" >&2; exit 1; }
    "$bin" plan --cpu --np $((students + 1)) "${common[@]}" --student.shard "$shard" --log.level warn \
      > "$dir/plan.txt"
  done
done

"${PYTHON:-python3}" - "$work" "$steps" <<'EOF'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def metrics(d):
    return [json.loads(l) for l in open(f"{work}/{d}/metrics.jsonl")]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def plan_bytes(d, name):
    # The 'placement cpu' table of `plan`: the row's last figure is the student rank's host memory.
    lines = open(f"{work}/{d}/plan.txt").read().split("placement cpu")[1].splitlines()
    words = next(l for l in lines if l.strip().startswith(name)).split()
    return float(words[-2]) * UNITS[words[-1]]
print("| students | shard | weights | grads | AdamW | bytes/param | formula | plan W+G+O | plan/measured | samples/s | max loss diff |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in (2, 4):
    base = [m["loss"] for m in metrics(f"s{n}-none") if "loss" in m]
    for shard in ("none", "optimizer", "gradients"):
        d = f"s{n}-{shard}"
        ms = metrics(d)
        mem = [m for m in ms if "memory_step" in m][-1]
        st = next(r for r in mem["ranks"] if r["role"] == "student")
        w, g, o = st["weights_bytes"], st["grads_bytes"], st["optimizer_state_bytes"]
        params = w / 4
        formula = {"none": 16, "optimizer": 8 + 8 / n, "gradients": 4 + 12 / n}[shard]
        planned = sum(plan_bytes(d, row) for row in ("student weights", "gradients", "optimizer state"))
        # samples/s over the second half of the run (start-up excluded)
        rates = [m["samples_per_s"] for m in ms if "samples_per_s" in m]
        rate = sum(rates[len(rates) // 2:]) / len(rates[len(rates) // 2:])
        losses = [m["loss"] for m in ms if "loss" in m]
        diff = max(abs(a - b) / abs(a) for a, b in zip(base, losses))
        print(f"| {n} | {shard} | {w/2**20:.2f} MiB | {g/2**20:.2f} MiB | {o/2**20:.2f} MiB | "
              f"{(w+g+o)/params:.3f} | {formula:.3f} | {planned/2**20:.2f} MiB | {planned/(w+g+o):.3f} | "
              f"{rate:.1f} | {diff:.1e} |")
EOF
