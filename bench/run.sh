#!/usr/bin/env bash
# Runs the benchmarks from an existing build and writes bench/results/<name>.md with the command,
# date and machine beside the numbers. Builds nothing.
#
#   bench/run.sh [load|forward|transport|train|checkpointing|all] [extra flags for the program]
#
# Environment:
#   BUILD_DIR     build tree holding bench/bench_load, bench/bench_forward, bench/bench_transport,
#                 bench/bench_checkpointing
#                 and src/app/wan-distill (default: build, relative to the repository root)
#   RESULTS_DIR   where the .md files go (default: bench/results)
#   THREADS       OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (default: nproc), the pool sizes the
#                 one-process programs start with; bench_forward then sets both to each --threads
#                 value. The MPI benchmarks (transport, train) run 1 thread per rank, as
#                 launch/mpirun.sh does.
#   NP            ranks of the MPI benchmarks (default 3: 1 teacher + 2 students)
#   MAX_LOAD      wait while the 1-minute load average is above this (default 1.5) ...
#   MAX_WAIT      ... for at most this many seconds (default 600), then run anyway and say so.
# OMP_WAIT_POLICY and OPENBLAS_* pass through unchanged and are recorded in the results.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
which=${1:-all}
shift || true
build=${BUILD_DIR:-build}
results=${RESULTS_DIR:-bench/results}
# GNU nproc reports OMP_NUM_THREADS when it is set; the machine's cores are wanted here.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
threads=${THREADS:-$cores}
max_load=${MAX_LOAD:-1.5}
max_wait=${MAX_WAIT:-600}
args="$*"

np=${NP:-3}
case "$which" in
  load | forward | transport | train | checkpointing | all) ;;
  *)
    echo "usage: bench/run.sh [load|forward|transport|train|checkpointing|all] [flags]" >&2
    exit 2
    ;;
esac
if [[ $which == all && $# -gt 0 ]]; then
  echo "run.sh: flags go to one program; name it (load, forward, transport, train, checkpointing) instead of all" >&2
  exit 2
fi
# require PATH TARGET: the built program, or how to build it.
require() {
  if [[ ! -x "$build/$1" ]]; then
    echo "run.sh: $build/$1 not found; build it first:" >&2
    echo "  cmake -S . -B $build -DWD_BUILD_BENCH=ON && cmake --build $build --target $2" >&2
    exit 1
  fi
}
[[ $which == load || $which == all ]] && require bench/bench_load bench_load
[[ $which == forward || $which == all ]] && require bench/bench_forward bench_forward
[[ $which == transport || $which == all ]] && require bench/bench_transport bench_transport
[[ $which == train || $which == all ]] && require src/app/wan-distill wan-distill
[[ $which == checkpointing || $which == all ]] && require bench/bench_checkpointing bench_checkpointing
mkdir -p "$results"

load1() { cut -d' ' -f1 /proc/loadavg; }

# Other work on the machine skews CPU timings; wait for a quieter moment, within a deadline.
wait_for_quiet() {
  local waited=0
  while awk -v l="$(load1)" -v m="$max_load" 'BEGIN { exit !(l > m) }'; do
    if ((waited >= max_wait)); then
      echo "run.sh: load $(load1) still above $max_load after ${waited}s; running anyway" >&2
      return 1
    fi
    echo "run.sh: load $(load1) > $max_load, waiting 60 s" >&2
    sleep 60
    waited=$((waited + 60))
  done
}

# The variables that change CPU timings, as set for the run (OPENBLAS_CORETYPE, for one, picks
# the GEMM kernels and may be set by the machine's environment).
env_line() {
  local v
  for v in OMP_NUM_THREADS OMP_WAIT_POLICY $(compgen -e | grep '^OPENBLAS_' | sort); do
    [[ -n ${!v:-} ]] && printf ' %s=%s' "$v" "${!v}"
  done
  return 0
}

# Writes the header of a results file: what ran, where and when.
header() {
  local title=$1 cmd=$2 quiet=$3
  local cpu blas torch_pkg
  cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
  blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo "unknown")
  torch_pkg=$(dpkg-query -W -f='${Package} ${Version}' 'libtorch[0-9]*' 2>/dev/null || echo "unknown")
  cat <<EOF
# $title

- command: \`$cmd\`
- run by: \`BUILD_DIR=$build bench/run.sh $which${args:+ $args}\`
- environment:$(env_line)
- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
- machine: $(uname -m), $cpu, $cores cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM
- Torch: $torch_pkg
- libblas.so.3: $blas
- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)$([[ $quiet == yes ]] || echo " (above $max_load after waiting ${max_wait}s)")

EOF
}

# run_one NAME TITLE THREADS COMMAND...: runs COMMAND with THREADS BLAS/OpenMP threads (per
# process) and writes $results/NAME.md.
run_one() {
  local name=$1 title=$2
  export OMP_NUM_THREADS=$3 OPENBLAS_NUM_THREADS=$3
  shift 3
  local quiet=yes
  wait_for_quiet || quiet=no
  local cmd="$*"
  local out="$results/$name.md" tmp="$results/$name.md.tmp.$$"
  echo "run.sh: $cmd > $out" >&2
  # Written beside the old file and renamed, so a failed run leaves the last results intact.
  if ! {
    header "$title" "$cmd" "$quiet"
    "$@"
    echo
    echo "- load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  } | tee "$tmp"; then
    rm -f "$tmp"
    echo "run.sh: $1 failed; $out left as it was" >&2
    exit 1
  fi
  mv "$tmp" "$out"
}

if [[ $which == load || $which == all ]]; then
  run_one checkpoint-load "Checkpoint loading: zero-copy bf16 vs reading the bytes" "$threads" \
    "$build/bench/bench_load" "$@"
fi
if [[ $which == forward || $which == all ]]; then
  run_one forward-cpu "DiT forward throughput on CPU" "$threads" "$build/bench/bench_forward" "$@"
fi
if [[ $which == transport || $which == all ]]; then
  run_one transport "Teacher -> student transport: MpiTransport vs plain MPI" 1 \
    bash launch/mpirun.sh -np "$np" "$build/bench/bench_transport" "$@"
fi
if [[ $which == train || $which == all ]]; then
  run_one train-e2e "End-to-end distillation on CPU: 1 teacher + 2 students" 1 \
    env WD_BIN="$build/src/app/wan-distill" NP="$np" bench/bench_train.sh "$@"
fi
if [[ $which == checkpointing || $which == all ]]; then
  run_one checkpointing "Gradient checkpointing of the student: activation memory and step time" \
    "$threads" "$build/bench/bench_checkpointing" "$@"
fi
