#!/usr/bin/env bash
# Runs the tests, the benchmarks and end-to-end training on a lent GPU machine after
# launch/gpu/build.sh, each step apart, and writes bench/results/gpu-<kind>.md from their records.
# Usage: [STEPS="smi ctest forward ..."] bash launch/gpu/run.sh
#
# Steps (default: all, in this order):
#   smi            nvidia-smi: the device, driver and CUDA version
#   ctest          every CTest test of build-gpu (CTEST_ARGS adds flags, CTEST_PARALLEL jobs: 8)
#   forward        bench/bench_forward            (FORWARD_ARGS)
#   stream         bench/bench_stream             (STREAM_ARGS)
#   checkpointing  bench/bench_checkpointing      (CHECKPOINTING_ARGS)
#   student_step   bench/bench_student_step       (STUDENT_STEP_ARGS), where it is built
#   nccl           bench/nccl_bandwidth, -np 1    (NCCL_ARGS)
#   train          wan-distill train, 1 teacher + 1 student on the GPU (TRAIN_STEPS: 300)
#   train2         the same with 2 students sharing the GPU (tiny default world of 3)
#   oom            a student batch far too large for the device: the job must stop with exit
#                  code 4 (out of memory) on every rank and write diagnosis.txt
# A benchmark that has a --device flag gets `--device cuda`; one without it runs as it is (CPU).
#
# Each step runs under `timeout` (STEP_TIMEOUT, default 540 s) and within RUN_BUDGET seconds of
# the script's start (default 580: one device command may run 10 minutes); a step that would
# start too late is recorded as not run. A step that fails, times out, lacks its program or meets
# an unknown flag is recorded as such and the next one runs. Records and logs go to RAW_DIR
# (default bench/results/gpu-raw/<step>.{log,meta}) and survive between runs on the same machine,
# so `STEPS=ctest` then `STEPS="forward train"` add up in one summary; FRESH=1 clears them first.
# Where $OUT is set (the device tool), the summary and a tarball of RAW_DIR are copied there.
# The script exits 0 once the summary is written; the steps' verdicts are in the summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
start_s=$SECONDS

build=${BUILD_DIR:-build-gpu}
raw=${RAW_DIR:-bench/results/gpu-raw}
raw_abs=$(realpath -m "$raw")
all_steps="smi ctest forward stream checkpointing student_step nccl train train2 oom"
steps=${STEPS:-$all_steps}
step_timeout=${STEP_TIMEOUT:-540}
budget=${RUN_BUDGET:-580}
bin=$build/src/app/wan-distill

say() { echo "run.sh: $*" >&2; }

for s in $steps; do
  [[ " $all_steps " == *" $s "* ]] || { say "unknown step '$s'; steps: $all_steps"; exit 2; }
done
if [[ ! -f $build/gpu-env.sh ]]; then
  say "$build/gpu-env.sh not found: run bash launch/gpu/build.sh first"
  exit 1
fi
# shellcheck source=/dev/null
. "$build/gpu-env.sh"
[[ -n ${FRESH:-} ]] && rm -rf "$raw"
mkdir -p "$raw"

# --- Recording ------------------------------------------------------------------------------
# record STEP RC STATUS COMMAND [NOTE]: the step's meta file, read back by the summary.
# step_seconds, display_cmd (the command as a person would type it) and ranks (of an MPI job)
# are taken when set.
record() {
  local step=$1 rc=$2 status=$3 cmd=${display_cmd:-$4} note=${5:-}
  {
    echo "rc=$rc"
    echo "ranks=${ranks:-}"
    echo "status=$status"
    echo "cmd=$cmd"
    echo "note=$note"
    echo "seconds=${step_seconds:-0}"
    echo "date=$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  } >"$raw/$step.meta"
  say "$step: $status (exit $rc)${note:+; $note}"
}

# has_flag FLAG PROGRAM [ARGS...]: whether PROGRAM [ARGS] --help mentions FLAG. (The help is
# read whole first: grep -q closing the pipe early would fail the pipeline under pipefail.)
has_flag() {
  local flag=$1 help
  shift
  help=$(timeout 60 "$@" --help 2>&1 || true)
  grep -q -- "$flag" <<<"$help"
}

# run_step STEP NOTE COMMAND...: runs COMMAND into $raw/STEP.log under the step's deadline and
# records how it ended.
run_step() {
  local step=$1 note=$2
  shift 2
  local left=$((budget - (SECONDS - start_s)))
  local limit=$((left < step_timeout ? left : step_timeout))
  local cmd="$*"
  if ((limit < 30)); then
    step_seconds=0
    record "$step" - "not run" "$cmd" "only ${left}s left of RUN_BUDGET=${budget}s; run it alone: STEPS=$step"
    return 0
  fi
  say "$step: $cmd (up to ${limit}s) > $raw/$step.log"
  local t0=$SECONDS rc=0
  {
    echo "# $cmd"
    echo "# started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), limit ${limit}s"
  } >"$raw/$step.log"
  timeout -k 15 "$limit" "$@" >>"$raw/$step.log" 2>&1 || rc=$?
  step_seconds=$((SECONDS - t0))
  local status=ok
  if ((rc == 124 || rc == 137)) && ((step_seconds >= limit)); then
    status="timed out after ${limit}s"
  elif ((rc != 0)); then
    status=failed
    # Boost.Program_options' wording, or an unknown subcommand: the flag is not in this build.
    local unknown
    unknown=$(grep -Eio "unrecogni[sz]ed option[^\"']*['\"][^'\"]*['\"]|unknown option[^\"']*['\"][^'\"]*['\"]" "$raw/$step.log" | head -1 || true)
    [[ -n $unknown ]] && status="unknown flag ($unknown)"
  fi
  record "$step" "$rc" "$status" "$cmd" "$note"
}

# missing STEP WHAT: the step's program (or a flag it needs) is not in this build.
missing() {
  step_seconds=0
  record "$1" - "missing" "-" "$2"
}

# bench_step STEP PROGRAM ARGS...: a one-process benchmark, on the GPU where it takes --device.
bench_step() {
  local step=$1 prog=$2
  shift 2
  if [[ ! -x $prog ]]; then
    missing "$step" "$prog not built"
    return 0
  fi
  local device=() note="no --device flag: runs on the CPU"
  if has_flag --device "$prog"; then
    device=(--device cuda)
    note="--device cuda"
  fi
  run_step "$step" "$note" "$prog" "${device[@]}" "$@"
}

# train_step STEP NP NOTE FLAGS...: wan-distill train under launch/mpirun.sh in $raw/STEP-run,
# recording every rank's exit code and keeping the diagnosis. Each rank runs inside a small bash
# that appends "world-rank exit-code" to $raw/STEP.ranks when the rank ends; its trap keeps it
# alive through mpirun's SIGTERM (sent to the rank's whole process group) so it can still write,
# and the program it starts gets default signal handlers, as without it.
train_step() {
  local step=$1 np=$2 note=$3
  shift 3
  if [[ ! -x $bin ]]; then
    missing "$step" "$bin not built"
    return 0
  fi
  local dir=$raw_abs/$step-run flags=("$@")
  # An option this build lacks is dropped and named rather than failing the run; the OOM case
  # needs the student on the GPU (on the host it would exhaust the machine's memory instead).
  if ! has_flag --student.device "$bin" train; then
    if [[ $step == oom ]]; then
      missing "$step" "wan-distill train has no --student.device (on the host the batch would exhaust the machine's memory, not the GPU's)"
      return 0
    fi
    local kept=() i
    for ((i = 0; i < ${#flags[@]}; i++)); do
      if [[ ${flags[i]} == --student.device ]]; then
        i=$((i + 1))
        continue
      fi
      kept+=("${flags[i]}")
    done
    flags=("${kept[@]}")
    note="$note; --student.device not in this build: dropped"
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  export WD_RANK_EXITS=$raw_abs/$step.ranks
  : >"$WD_RANK_EXITS"
  display_cmd="bash launch/mpirun.sh -np $np $bin train --run-dir $dir ${flags[*]}"
  ranks=$np
  # shellcheck disable=SC2016  # expanded by each rank's bash
  run_step "$step" "$note" bash launch/mpirun.sh -np "$np" \
    bash -c 'trap true TERM INT; "$@"; rc=$?; echo "${OMPI_COMM_WORLD_RANK:-?} $rc" >>"$WD_RANK_EXITS"; exit $rc' wd-rank \
    "$bin" train --run-dir "$dir" "${flags[@]}"
  unset display_cmd ranks
  [[ -f $dir/diagnosis.txt ]] && cp "$dir/diagnosis.txt" "$raw/$step.diagnosis.txt"
  return 0
}

# --- The steps ------------------------------------------------------------------------------
gpu_name=unknown
driver=unknown
cuda_driver=unknown
query_gpu() {
  if command -v nvidia-smi >/dev/null; then
    local q
    q=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
    if [[ -n $q ]]; then
      gpu_name=$(cut -d, -f1 <<<"$q" | xargs)
      driver=$(cut -d, -f2 <<<"$q" | xargs)
      gpu_memory=$(cut -d, -f3 <<<"$q" | xargs)
    fi
    cuda_driver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1 || true)
  fi
}
query_gpu

for s in $steps; do
  # What an earlier run of this step left would otherwise be read as this run's.
  rm -f "$raw/$s.log" "$raw/$s.meta" "$raw/$s.ranks" "$raw/$s.diagnosis.txt"
  case $s in
    smi)
      if command -v nvidia-smi >/dev/null; then
        run_step smi "" nvidia-smi
      else
        missing smi "nvidia-smi not on PATH"
      fi
      ;;
    ctest)
      junit=()
      has_flag --output-junit ctest && junit=(--output-junit "$raw_abs/ctest-junit.xml")
      # shellcheck disable=SC2086  # CTEST_ARGS is a list of flags
      run_step ctest "" ctest --test-dir "$build" --output-on-failure --parallel "${CTEST_PARALLEL:-8}" \
        "${junit[@]}" ${CTEST_ARGS:-}
      ;;
    forward)
      # shellcheck disable=SC2086
      bench_step forward "$build/bench/bench_forward" ${FORWARD_ARGS:-}
      ;;
    stream)
      # shellcheck disable=SC2086
      bench_step stream "$build/bench/bench_stream" ${STREAM_ARGS:-}
      ;;
    checkpointing)
      # shellcheck disable=SC2086
      bench_step checkpointing "$build/bench/bench_checkpointing" ${CHECKPOINTING_ARGS:-}
      ;;
    student_step)
      # shellcheck disable=SC2086
      bench_step student_step "$build/bench/bench_student_step" ${STUDENT_STEP_ARGS:-}
      ;;
    nccl)
      if [[ -x $build/bench/nccl_bandwidth ]]; then
        # One rank: two ranks on one GPU is a duplicate-GPU error for NCCL.
        # shellcheck disable=SC2086
        run_step nccl "one rank (send/recv to self)" bash launch/mpirun.sh -np 1 \
          "$build/bench/nccl_bandwidth" ${NCCL_ARGS:-}
      else
        missing nccl "$build/bench/nccl_bandwidth not built (needs the CUDA toolkit and NCCL at configure time)"
      fi
      ;;
    train)
      train_step train 2 "1 teacher + 1 student" --student.device cuda --teacher.placement gpu \
        --train.steps "${TRAIN_STEPS:-300}"
      ;;
    train2)
      train_step train2 3 "1 teacher + 2 students on one GPU" --student.device cuda \
        --teacher.placement gpu --train.steps "${TRAIN_STEPS:-300}"
      ;;
    oom)
      # A dim-2048, 8-block student at 2048 samples x 192 tokens per step needs several hundred
      # GB of activations: more than any one GPU has. eval_samples must divide by the batch.
      batch=${OOM_BATCH:-2048}
      # shellcheck disable=SC2086  # OOM_ARGS is a list of flags
      train_step oom 2 "expected: exit 4 (out of memory) on every rank" --student.device cuda \
        --teacher.placement gpu --train.steps 3 --train.batch_size "$batch" \
        --train.eval_samples 0 --data.builtin_samples "$batch" \
        --student.dim 2048 --student.num_heads 16 --student.num_layers 8 --student.ffn_dim 8192 \
        ${OOM_ARGS:-}
      ;;
  esac
done

# --- The summary ----------------------------------------------------------------------------
torch_version=$("${PYTHON:-python3}" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo unknown)
kind=${KIND:-$(grep -Eio 'h100|h200|a100|b200|l40s?' <<<"$gpu_name" | head -1 | tr '[:upper:]' '[:lower:]' || true)}
kind=${kind:-unknown}
summary=bench/results/gpu-$kind.md

meta() { sed -n "s/^$2=//p" "$raw/$1.meta"; }
# ctest_counts: "N passed, N failed, N skipped of M" from the CTest log.
ctest_counts() {
  local log=$raw/ctest.log
  local line total failed skipped
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | tail -1 || true)
  [[ -n $line ]] || { echo "no CTest summary in the log"; return; }
  failed=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  skipped=$(grep -Ec '\*\*\*Skipped' "$log" || true)
  echo "$((total - failed - skipped)) passed, $failed failed, $skipped skipped of $total"
}

{
  echo "# wan-distill on one GPU: $gpu_name"
  echo
  echo "- device: $gpu_name${gpu_memory:+, $gpu_memory}; driver $driver (CUDA $cuda_driver)"
  echo "- Torch: $torch_version; build: \`$build\` (launch/gpu/build.sh), $(cmake --version | head -1)"
  echo "- Open MPI: $(mpirun --version 2>&1 | head -1) from \`$WD_GPU_PREFIX\`"
  echo "- machine: $(uname -m), $(nproc) cores, $(awk '/^MemTotal:/ { printf "%d", $2 / 1048576 }' /proc/meminfo) GiB RAM, kernel $(uname -r)"
  echo "- written: $(date -u '+%Y-%m-%d %H:%M:%S UTC') by \`STEPS=\"$steps\" bash launch/gpu/run.sh\`"
  echo "- logs: \`$raw/<step>.log\` (records: \`<step>.meta\`)"
  echo
  echo "| step | exit | result | seconds | command | log |"
  echo "|---|---|---|---|---|---|"
  for s in $all_steps; do
    [[ -f $raw/$s.meta ]] || continue
    log=-
    [[ -f $raw/$s.log ]] && log="\`$raw/$s.log\`"
    echo "| $s | $(meta "$s" rc) | $(meta "$s" status)$(n=$(meta "$s" note); [[ -n $n ]] && echo "; $n") | $(meta "$s" seconds) | \`$(meta "$s" cmd)\` | $log |"
  done
  if [[ -f $raw/ctest.meta && -f $raw/ctest.log ]]; then
    echo
    echo "## CTest"
    echo
    echo "$(ctest_counts). Skipped here (a test that needs a GPU should not be among them):"
    echo
    grep -E '\*\*\*Skipped' "$raw/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+).*/- \1/' | sort -u || true
    echo
    echo "Failed:"
    echo
    sed -n '/The following tests FAILED:/,$p' "$raw/ctest.log" | grep -E '^\s+[0-9]+ - ' | sed 's/^ */- /' || echo "- none"
  fi
  for s in train train2 oom; do
    [[ -f $raw/$s.meta ]] || continue
    echo
    echo "## $s"
    echo
    # A rank with no line was killed outright (with its wrapper) or never started.
    np=$(meta "$s" ranks)
    if [[ -s $raw/$s.ranks ]]; then
      echo "Exit code by world rank ($(wc -l <"$raw/$s.ranks") of ${np:-?} ranks recorded):" \
        "$(sort -n "$raw/$s.ranks" | awk '{ printf "%srank %s: %s", (NR > 1 ? ", " : ""), $1, $2 }')."
    else
      echo "No rank recorded an exit code (none started, or each was killed outright)."
    fi
    if [[ $s == oom && -n $np ]]; then
      if [[ $(awk '$2 == 4' "$raw/$s.ranks" 2>/dev/null | wc -l) == "$np" ]]; then
        echo "Verdict: as documented, exit code 4 (out of memory) on every rank."
      else
        echo "Verdict: NOT as documented (exit code 4 on each of the $np ranks)."
      fi
    fi
    if [[ -f $raw/$s.diagnosis.txt ]]; then
      echo "Diagnosis: \`$raw/$s.diagnosis.txt\`"
      echo
      echo '```'
      cat "$raw/$s.diagnosis.txt"
      echo '```'
    else
      echo "No diagnosis.txt in \`$raw/$s-run/\`."
    fi
    if [[ -f $raw/$s-run/summary.json ]]; then
      echo
      echo "summary.json: \`$raw/$s-run/summary.json\`"
    fi
  done
  echo
  echo "## Findings"
  echo
  echo "(written by hand after the run)"
} >"$summary"
say "summary: $summary"
cat "$summary"

if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
  cp "$summary" "$OUT/"
  tar -czf "$OUT/gpu-raw.tar.gz" --exclude='*-run/cache' "$raw" 2>/dev/null || true
  say "copied $summary and $raw (as gpu-raw.tar.gz, without the run caches) to $OUT"
fi
