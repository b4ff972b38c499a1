#!/usr/bin/env bash
# student.shard optimizer (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3) against plain
# data-parallel on the CPU `small` job (the bench_throughput.sh config: a dim-512, 8-block
# teacher, a dim-256, 4-block student) with 2 and 4 students and one teacher rank, gradient
# buckets of 1 MB (the student's 14.5 MiB of gradients in 15): per-rank weights, gradients and
# AdamW bytes from the memory report (metrics.jsonl), bytes per parameter against the formulas
# (16 unsharded, 8 + 8/N with optimizer, 4 + 12/N with gradients, 16/N + 4·R/P with parameters,
# R of the P parameters outside the blocks; fp32), `plan`'s sum of the three for the same job,
# samples/s, and whether the loss curves agree. parameters needs every block checkpointed, so
# `gradients+all` (gradients with student.checkpointing all) is its baseline for speed.
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

if [[ ${SMALL:-1} == 1 ]]; then
for students in 2 4; do
  for mode in none optimizer gradients gradients+all parameters; do
    shard=${mode%+all}
    keys=(--student.shard "$shard")
    [[ $mode == *+all || $mode == parameters ]] && keys+=(--student.checkpointing all)
    dir=$work/s$students-$mode
    rm -rf "$dir"
    cmd=(bash "$repo/launch/mpirun.sh" -np $((students + 1)) "$bin" train --run-dir "$dir" "${common[@]}"
         --train.steps "$steps" "${keys[@]}")
    echo "bench_sharding.sh: ${cmd[*]}" >&2
    "${cmd[@]}" > "$work/s$students-$mode.log" 2>&1 || { tail -20 "$work/s$students-$mode.log" >&2; exit 1; }
    "$bin" plan --cpu --np $((students + 1)) "${common[@]}" "${keys[@]}" --log.level warn > "$dir/plan.txt"
  done
done

"${PYTHON:-python3}" - "$work" "$steps" <<'EOF'
import json, re, sys
work, steps = sys.argv[1], int(sys.argv[2])
def metrics(d):
    return [json.loads(l) for l in open(f"{work}/{d}/metrics.jsonl")]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def plan_bytes(d, name):
    # The 'placement cpu' table of `plan`: the row's last figure is the student rank's host memory.
    lines = open(f"{work}/{d}/plan.txt").read().split("placement cpu")[1].splitlines()
    words = next(l for l in lines if l.strip().startswith(name)).split()
    return float(words[-2]) * UNITS[words[-1]]
print("| students | shard | weights | grads | AdamW | bytes/param | formula | plan W+G+O | plan/measured | samples/s | max loss diff | peak RSS (a student) |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def student_row(ms):
    mem = [m for m in ms if "memory_step" in m][-1]
    return next(r for r in mem["ranks"] if r["role"] == "student")
for n in (2, 4):
    base = [m["loss"] for m in metrics(f"s{n}-none") if "loss" in m]
    params = student_row(metrics(f"s{n}-none"))["weights_bytes"] / 4
    # The parameters outside the blocks (held whole with student.shard parameters), as logged.
    outside = int(re.search(r"holds its slice and the (\d+) parameters outside the blocks",
                            open(f"{work}/s{n}-parameters.log").read()).group(1))
    for shard in ("none", "optimizer", "gradients", "gradients+all", "parameters"):
        d = f"s{n}-{shard}"
        ms = metrics(d)
        st = student_row(ms)
        w, g, o = st["weights_bytes"], st["grads_bytes"], st["optimizer_state_bytes"]
        formula = {"none": 16, "optimizer": 8 + 8 / n, "gradients": 4 + 12 / n, "gradients+all": 4 + 12 / n,
                   "parameters": 16 / n + 4 * outside / params}[shard]
        planned = sum(plan_bytes(d, row) for row in ("student weights", "gradients", "optimizer state"))
        # samples/s over the second half of the run (start-up excluded)
        rates = [m["samples_per_s"] for m in ms if "samples_per_s" in m]
        rate = sum(rates[len(rates) // 2:]) / len(rates[len(rates) // 2:])
        losses = [m["loss"] for m in ms if "loss" in m]
        diff = max(abs(a - b) / abs(a) for a, b in zip(base, losses))
        print(f"| {n} | {shard} | {w/2**20:.2f} MiB | {g/2**20:.2f} MiB | {o/2**20:.2f} MiB | "
              f"{(w+g+o)/params:.3f} | {formula:.3f} | {planned/2**20:.2f} MiB | {planned/(w+g+o):.3f} | "
              f"{rate:.1f} | {diff:.1e} | {st.get('peak_rss_bytes', 0)/2**20:.0f} MiB |")
EOF
fi

# A student whose state is most of what a rank holds: dim 1024, 12 blocks, ffn 4096 (~0.2 B
# parameters: 0.8 GiB of fp32 weights, 3.3 GiB of weights + gradients + AdamW unsharded) on 4
# students, with latents of 16 tokens so that memory, not compute, is what the run shows: each
# student's peak RSS (summary.json), its weights + gradients + AdamW (the last memory report) and
# `plan`'s student total, with none, gradients and parameters. BIG=0 skips it (~6 min here),
# SMALL=0 the small job. The peak RSS is the last memory report's (steps 5-8: training alone); the
# run's lifetime peak also holds start-up, where every student builds the whole student once, and
# the final save, which gathers it whole again for the writer.
[[ ${BIG:-1} == 1 ]] || exit 0
[[ -f $work/data-big.h5 ]] ||
  "$bin" make-dataset --latent 16,1,8,8 --text-len 32 --text-dim 256 --samples 96 --seed 0 \
    --output "$work/data-big.h5" --log.level warn
big=(--teacher.checkpoint "$work/teacher" --data.path "$work/data-big.h5" --teacher.placement cpu --teacher.ranks 1
     --student.dim 1024 --student.ffn_dim 4096 --student.num_heads 8 --student.num_layers 12
     --train.batch_size 2 --train.eval_samples 8 --train.log_every 1 --memory.report_every 4 --comm.bucket_mb 25
     --student.checkpointing all)
for shard in none gradients parameters; do
  dir=$work/big-$shard
  rm -rf "$dir"
  cmd=(bash "$repo/launch/mpirun.sh" -np 5 "$bin" train --run-dir "$dir" "${big[@]}" --train.steps 8
       --student.shard "$shard")
  echo "bench_sharding.sh: ${cmd[*]}" >&2
  "${cmd[@]}" > "$work/big-$shard.log" 2>&1 || { tail -20 "$work/big-$shard.log" >&2; exit 1; }
  "$bin" plan --cpu --np 5 "${big[@]}" --student.shard "$shard" --log.level warn > "$dir/plan.txt"
done
"${PYTHON:-python3}" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def plan_total(d):
    lines = open(f"{work}/{d}/plan.txt").read().split("placement cpu")[1].splitlines()
    words = next(l for l in lines if l.strip().startswith("total")).split()
    return float(words[-2]) * UNITS[words[-1]]
print()
print("| 4 students, dim 1024 x 12 | weights + grads + AdamW | peak RSS in steps 5-8 (max of 4 students) | lifetime peak RSS | plan: a student's host total | samples/s |")
print("|---|---:|---:|---:|---:|---:|")
for shard in ("none", "gradients", "parameters"):
    d = f"big-{shard}"
    ms = [json.loads(l) for l in open(f"{work}/{d}/metrics.jsonl")]
    mem = [m for m in ms if "memory_step" in m][-1]
    st = next(r for r in mem["ranks"] if r["role"] == "student")
    state = st["weights_bytes"] + st["grads_bytes"] + st["optimizer_state_bytes"]
    window = max(r["peak_rss_bytes"] for r in mem["ranks"] if r["role"] == "student")
    summary = json.load(open(f"{work}/{d}/summary.json"))
    peak = max(r["peak_rss_bytes"] for r in summary["ranks"] if r["role"] == "student")
    rates = [m["samples_per_s"] for m in ms if "samples_per_s" in m]
    rate = sum(rates[len(rates) // 2:]) / len(rates[len(rates) // 2:])
    print(f"| {shard} | {state/2**30:.2f} GiB | {window/2**30:.2f} GiB | {peak/2**30:.2f} GiB | "
          f"{plan_total(d)/2**30:.2f} GiB | {rate:.2f} |")
PY
