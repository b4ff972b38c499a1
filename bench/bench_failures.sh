#!/usr/bin/env bash
# bench_failures.sh: how fast a failed job stops, and what a checkpoint costs. Runs the tiny job
# (1 teacher + 2 students) with injected faults and prints a markdown table from the rank logs'
# timestamps: fault -> diagnosis printed -> last rank exiting, and mpirun's wall time. Then
# times checkpoint saves of a larger student from the "checkpoint of step N written" lines.
#
#   bench/bench_failures.sh
#
# Environment: WD_BIN (default build/src/app/wan-distill), WORK_DIR (default /tmp/wd-bench-fail),
# DEADLINE (comm.timeout_s for the silent-rank cases, default 4), GRACE (mpirun's
# odls_base_sigkill_timeout, default 3; silent cases use DEADLINE + 8).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-fail}
deadline=${DEADLINE:-4}
grace=${GRACE:-3}
rm -rf "$work" && mkdir -p "$work"

run() {  # run NAME GRACE ARGS...: one launch, its log in $work/NAME.log, wall seconds in NAME.secs
  local name=$1 g=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  WD_KILL_GRACE=$g bash "$repo/launch/mpirun.sh" -np 3 "$bin" train --run-dir "$work/$name" "$@" \
    > "$work/$name.log" 2>&1 || true
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc > "$work/$name.secs"
}

cases=("oom@student:1:6" "nan@teacher:0:6" "throw@student:0:6" "sigterm@teacher:0:6"
       "sigkill@student:1:6" "hang@student:1:6")
for c in "${cases[@]}"; do
  g=$grace
  [[ $c == sigkill* || $c == hang* ]] && g=$((deadline + 8))
  run "fault-${c//[@:]/-}" "$g" --train.steps 40 --comm.timeout_s "$deadline" --inject-fault "$c"
done
# Checkpoint cost: a student of dim 512 x 8 blocks (~30 M parameters), a checkpoint every 5 steps.
run ckpt "$grace" --train.steps 20 --train.log_every 1 --checkpoint.every 5 --checkpoint.keep 2 \
  --student.dim 512 --student.ffn_dim 2048 --student.num_heads 8 --student.num_layers 8

python3 - "$work" "$deadline" "${cases[@]}" <<'PY'
import datetime, os, re, sys
work, deadline, cases = sys.argv[1], sys.argv[2], sys.argv[3:]
stamp = re.compile(r"^\[(\d\d):(\d\d):(\d\d)\.(\d\d\d)\]")
def t(line):
    m = stamp.match(line)
    return None if not m else int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) + int(m[4]) / 1000
def lines(name):
    return open(os.path.join(work, name + ".log"), errors="replace").read().splitlines()
print(f"| fault | comm.timeout_s | fault -> diagnosis (s) | fault -> last rank exits (s) | ranks exiting | mpirun wall (s) |")
print("|---|---|---|---|---|---|")
for c in cases:
    name = "fault-" + re.sub(r"[@:]", "-", c)
    ls = lines(name)
    inject = next(t(l) for l in ls if "injecting fault" in l)
    diag = [t(l) for l in ls if "] [error] " in l and t(l) is not None]
    diag_at = next((t(ls[i - 1]) for i, l in enumerate(ls) if "train stopped: diagnosis" in l), None)
    exits = [t(l) for l in ls if "exiting with code" in l]
    codes = sorted(set(re.search(r"exiting with code (\d+)", l)[1] for l in ls if "exiting with code" in l))
    wall = float(open(os.path.join(work, name + ".secs")).read())
    d = f"{diag_at - inject:.2f}" if diag_at else "-"
    print(f"| `{c}` | {deadline} | {d} | {max(exits) - inject:.2f} | {len(exits)} (code {','.join(codes)}) | {wall:.1f} |")
ls = lines("ckpt")
saves = []
for i, l in enumerate(ls):
    if "checkpoint of step" in l:
        step = re.search(r"checkpoint of step (\d+)", l)[1]
        prev = next(t(ls[j]) for j in range(i - 1, -1, -1) if f"step {step}/" in ls[j])
        saves.append((step, t(l) - prev))
size = 0
for root, _, files in os.walk(os.path.join(work, "ckpt", "checkpoints")):
    for f in files:
        size += os.path.getsize(os.path.join(root, f))
n = len([d for d in os.listdir(os.path.join(work, "ckpt", "checkpoints")) if d.startswith("step-")])
print()
print(f"checkpoint saves (dim 512 x 8 blocks): " + ", ".join(f"step {s}: {d:.2f} s" for s, d in saves) +
      f"; {size / n / 2**20:.0f} MiB per checkpoint on disk ({n} kept)")
PY
