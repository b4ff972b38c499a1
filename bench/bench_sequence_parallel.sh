#!/usr/bin/env bash
# bench_sequence_parallel.sh: student.sequence_parallel on CPU ranks at 4096 tokens a sample.
#   memory: for groups of 1, 2 and 4 (one teacher rank + N students, one group), checkpointing off
#           and all, a full and a LoRA student: each student rank's activations (its peak RSS
#           growth after start-up less the planner's weights, gradients, optimizer state and
#           transport buffers, which sequence parallelism leaves alone) against N = 1's / N, and
#           against `plan --cpu`'s "student activations".
#   speed:  the same 3 ranks (1 teacher + 2 students) at N = 1 (two data-parallel students) and
#           N = 2 (one group): samples/s over the run's last half.
# Prints markdown tables and the commands.
#
#   bench/bench_sequence_parallel.sh [STEPS]      (default 6)
#
# Environment: WD_BIN (default build/src/app/wan-distill), WORK_DIR (default /tmp/wd-bench-sp),
# SIZES (the group sizes of the memory jobs, default "1 2 4"), KEEP_ROWS=1 (add to the rows of an
# earlier run instead of starting afresh), SKIP=memory|speed (leave one part out), ONLY (a regex
# of the memory jobs' names to run, e.g. "all-2|lora-off-2").
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-sp}
steps=${1:-6}
if [[ ! -x $bin ]]; then
  echo "bench_sequence_parallel.sh: $bin not found; build wan-distill first or set WD_BIN" >&2
  exit 1
fi
mkdir -p "$work"
# 4 x 32 x 32 = 4096 tokens a sample, the builtin tiny teacher's channels and text.
data=$work/data-4096.h5
if [[ ! -f $data ]]; then
  "$bin" make-dataset --output "$data" --samples 16 --latent 16,4,64,64 --text-len 16 --text-dim 64 \
    --log.level warn >&2
fi
student="--student.dim 256 --student.ffn_dim 1024 --student.num_heads 4 --student.num_layers 4"
lora="--student.lora_rank 8 --train.objective guided"
common_flags="--data.path $data --train.eval_samples 4 --teacher.compute fp32 --runtime.threads 1"

jobs=()
[[ ${SKIP:-} == memory ]] && SIZES=" "
for n in ${SIZES:-1 2 4}; do
  jobs+=("full-off-$n|$n|$student")
  jobs+=("full-all-$n|$n|$student --student.checkpointing all")
  jobs+=("lora-off-$n|$n|$lora")
done

rows=$work/rows.jsonl
[[ ${KEEP_ROWS:-} == 1 ]] || : >"$rows"
for job in "${jobs[@]}"; do
  IFS='|' read -r name n flags <<<"$job"
  [[ $name =~ ${ONLY:-.} ]] || continue
  read -r -a args <<<"$flags $common_flags --student.sequence_parallel $n"
  dir=$work/$name
  rm -rf "$dir"
  common=(--run-dir "$dir" --train.steps "$steps" --memory.report_every 0)
  "$bin" plan --cpu --np $((n + 1)) --json "${common[@]}" "${args[@]}" >"$work/$name.plan.json"
  cmd=(bash "$repo/launch/mpirun.sh" -np $((n + 1)) "$bin" train "${common[@]}" "${args[@]}")
  echo "bench_sequence_parallel.sh: ${cmd[*]}" >&2
  if ! "${cmd[@]}" >"$work/$name.log" 2>&1; then
    echo "bench_sequence_parallel.sh: $name failed; last lines of $work/$name.log:" >&2
    tail -20 "$work/$name.log" >&2
    exit 1
  fi
  python3 - "$name" "$n" "$work/$name.plan.json" "$dir/summary.json" "$flags" >>"$rows" <<'PY'
import json, sys
name, n, plan_file, summary_file, flags = sys.argv[1:6]
cpu = next(p for p in json.load(open(plan_file))["placements"] if p["placement"] == "cpu")
items = {i["name"]: i["host_bytes"] for i in cpu["student"]["items"]}
others = sum(items.get(k, 0) for k in ("student weights", "gradients", "optimizer state", "transport buffers"))
students = [r for r in json.load(open(summary_file))["ranks"] if r["role"] == "student"]
measured = [r["peak_rss_bytes"] - r["start_rss_bytes"] - others for r in students]
print(json.dumps({"name": name, "n": int(n), "flags": flags, "predicted": items["student activations"],
                  "measured": max(measured), "ranks": len(students)}))
PY
done

# Speed: the same three ranks, two data-parallel students against one group of two.
speed=$work/speed.jsonl
if [[ ${SKIP:-} == speed ]]; then touch "$speed"; else : >"$speed"; fi
speed_sizes="1 2"
[[ ${SKIP:-} == speed ]] && speed_sizes=""
for n in $speed_sizes; do
  dir=$work/speed-$n
  rm -rf "$dir"
  read -r -a args <<<"$student $common_flags --student.sequence_parallel $n --train.log_every 1"
  cmd=(bash "$repo/launch/mpirun.sh" -np 3 "$bin" train --run-dir "$dir" --train.steps $((2 * steps)) "${args[@]}")
  echo "bench_sequence_parallel.sh: ${cmd[*]}" >&2
  "${cmd[@]}" >"$work/speed-$n.log" 2>&1 || { tail -20 "$work/speed-$n.log" >&2; exit 1; }
  python3 - "$n" "$dir/metrics.jsonl" >>"$speed" <<'PY'
import json, sys
rows = [m for m in map(json.loads, open(sys.argv[2])) if "samples_per_s" in m]
tail = rows[len(rows) // 2:]
print(json.dumps({"n": int(sys.argv[1]), "samples_per_s": sum(m["samples_per_s"] for m in tail) / len(tail)}))
PY
done

python3 - "$rows" "$speed" "$steps" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mib = lambda b: b / 2**20
one = {r["name"].rsplit("-", 1)[0]: r["measured"] for r in rows if r["n"] == 1}
print("| job | N | student ranks | measured activations MiB (worst rank) | N = 1's / N MiB | measured / (N = 1's / N) | plan MiB | plan error |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    base = one[r["name"].rsplit("-", 1)[0]] / r["n"]
    print(f"| {r['name']} | {r['n']} | {r['ranks']} | {mib(r['measured']):.1f} | {mib(base):.1f} | "
          f"{r['measured'] / base:.2f} | {mib(r['predicted']):.1f} | {100 * (r['predicted'] - r['measured']) / r['measured']:+.1f}% |")
s = {r["n"]: r["samples_per_s"] for r in map(json.loads, open(sys.argv[2]))}
if len(s) == 2: print(f"\nspeed, 1 teacher + 2 student ranks: N = 1 (2 data-parallel students) {s[1]:.3f} samples/s, "
      f"N = 2 (one group) {s[2]:.3f} samples/s: {s[2] / s[1]:.2f}x\n")
print(f"Flags of each job (after `train --run-dir DIR --train.steps {sys.argv[3]} --memory.report_every 0`, "
      "plus the data set, eval_samples 4, teacher.compute fp32, runtime.threads 1):\n")
for r in rows:
    print(f"- {r['name']}: `{r['flags']} --student.sequence_parallel {r['n']}`")
PY
