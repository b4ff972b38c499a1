#!/usr/bin/env bash
# Runs the benchmarks from an existing build and writes bench/results/<name>.md with the command,
# date and machine beside the numbers. Builds nothing.
#
#   bench/run.sh [load|forward|all] [extra flags for the program]
#
# Environment:
#   BUILD_DIR     build tree holding bench/bench_load and bench/bench_forward (default: build,
#                 relative to the repository root)
#   RESULTS_DIR   where the .md files go (default: bench/results)
#   THREADS       OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (default: nproc), the pool sizes the
#                 programs start with; bench_forward then sets both to each --threads value.
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
threads=${THREADS:-$(nproc)}
max_load=${MAX_LOAD:-1.5}
max_wait=${MAX_WAIT:-600}
args="$*"

case "$which" in
  load | forward | all) ;;
  *)
    echo "usage: bench/run.sh [load|forward|all] [flags]" >&2
    exit 2
    ;;
esac
if [[ $which == all && $# -gt 0 ]]; then
  echo "run.sh: flags go to one program; name it (load or forward) instead of all" >&2
  exit 2
fi
for prog in bench_load bench_forward; do
  if [[ ! -x "$build/bench/$prog" ]]; then
    echo "run.sh: $build/bench/$prog not found; build it first:" >&2
    echo "  cmake -S . -B $build && cmake --build $build --target bench_load bench_forward" >&2
    exit 1
  fi
done
mkdir -p "$results"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

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
- machine: $(uname -m), $cpu, $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM
- Torch: $torch_pkg
- libblas.so.3: $blas
- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)$([[ $quiet == yes ]] || echo " (above $max_load after waiting ${max_wait}s)")

EOF
}

run_one() {
  local prog=$1 name=$2 title=$3
  shift 3
  local quiet=yes
  wait_for_quiet || quiet=no
  local cmd="$build/bench/$prog${*:+ $*}"
  local out="$results/$name.md" tmp="$results/$name.md.tmp.$$"
  echo "run.sh: $cmd > $out" >&2
  # Written beside the old file and renamed, so a failed run leaves the last results intact.
  if ! {
    header "$title" "$cmd" "$quiet"
    "$build/bench/$prog" "$@"
    echo
    echo "- load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  } | tee "$tmp"; then
    rm -f "$tmp"
    echo "run.sh: $prog failed; $out left as it was" >&2
    exit 1
  fi
  mv "$tmp" "$out"
}

if [[ $which == load || $which == all ]]; then
  run_one bench_load checkpoint-load "Checkpoint loading: zero-copy bf16 vs reading the bytes" "$@"
fi
if [[ $which == forward || $which == all ]]; then
  run_one bench_forward forward-cpu "DiT forward throughput on CPU" "$@"
fi
