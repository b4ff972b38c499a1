#!/usr/bin/env bash
# The one command for a lent GPU machine: preflight, build, then the GPU steps ordered by value,
# each under its own deadline and all within one time budget, rewriting $OUT/summary.md and the
# step's log after every step so that a command cut off still returns its evidence.
# Usage: bash launch/gpu/all.sh       (device tool: run(command="bash launch/gpu/all.sh", carry=["gpu-debs"]))
#
# Steps after preflight and build, in this order (STEPS picks and orders them):
#   smi            nvidia-smi and the GPU's name, driver, memory and compute mode
#   nccl_init      CTest test_nccl_mpi_gpu_np1: NCCL's first start on the machine, alone
#   nccl           bench/nccl_bandwidth -np 1: NCCL send/recv to self against cudaMemcpy
#   train          wan-distill train, 1 teacher + 1 student on the GPU (2 ranks)
#   train_mpi      the same with --comm.backend mpi: tells an NCCL problem from a training one
#   oom            a student batch far beyond the GPU: exit 4 on every rank and diagnosis.txt
#   train_stream   train with --teacher.placement stream (the CUDA copy engine)
#   train_ckpt     train with --student.checkpointing all (device RNG replay in the backward)
#   train_bf16     train with --student.precision bf16-mixed
#   colocated      train, one rank, --teacher.placement colocated with a student of another
#                  in_dim and sampling probes (the host/device mix of teacher messages)
#   forward        bench_forward at Wan 2.2 TI2V-5B dims, bf16, 480p tokens, with MFU
#   stream         bench_stream --device cuda
#   checkpointing  bench_checkpointing --device cuda
#   ctest_gpu      builds the executables of the CTest tests labelled gpu, then ctest -L gpu
#   profile        (not in the default list: STEPS="profile") launch/gpu/profile.sh: Kineto's
#                  top 25 kernels of a TI2V-5B forward and their time by category per block, each
#                  block timed, the pinned H2D bandwidth, bench_stream at real TI2V-5B and A14B
#                  block dims (arena, 720p, the copy threads' fallback) beside plan's ratio; all
#                  in profile.md (in logs.tar.gz), key figures in the summary row
# Not in the default list: train2 (1 teacher + 2 students on the GPU, 3 ranks), trajectory (the
# teacher's sampler on the GPU, the trajectory objective), dmd (the dmd objective: the critic on
# the GPU, the teacher rank answering real-score requests), dmd_colocated (dmd with the teacher on
# the student's rank), shard_none_bf16, shard_optimizer, shard_gradients, shard_gradients_bf16 (train2
# with student.shard; the two students share the GPU, so over MPI), lora and lora_dmd (LoRA students
# on the GPU: guided, and dmd with a LoRA critic), trajectory_i2v and dmd_i2v (the two with a tiny
# i2v teacher, I2V-A14B's layout: y in every teacher, generator and critic forward),
# sequence_parallel (1 teacher + one group of 2 students sharing the GPU, student.sequence_parallel 2:
# the all-to-all over MPI; compare its losses with train's), sequence_parallel_nccl (the same on
# two GPUs or more, the all-to-all over NCCL; "needs 2 GPUs" and skipped where fewer are visible),
# shard_optimizer_nccl and shard_gradients_nccl (train2 with student.shard on two GPUs or more: the
# students on distinct GPUs, ZeRO's reduce-scatter and all-gather over NCCL; compare the loss with
# shard_optimizer's and shard_gradients'; "needs 2 GPUs" and skipped where fewer are visible)
# and ctest (the whole suite; many tests assume a CPU-only host).
#
# Environment:
#   OUT            the folder that comes back (the device tool sets it): summary.md, logs.tar.gz
#                  and the running step's log; default bench/results/gpu-raw, which then holds
#                  every file as it is
#   LOGS_DIR       where the step files are written when OUT is set (default build-gpu/gpu-logs,
#                  emptied at the start): the device tool returns at most 8 files from OUT, so
#                  OUT gets them packed, logs.tar.gz rewritten after every step
#   GPU_BUDGET_S   seconds for the whole command (default 560: the device's 600 s less the time
#                  to stop a step and return the files); a step that cannot start with at least
#                  MIN_STEP_S (20) left is recorded "not run"
#   STEPS          the steps to run, e.g. STEPS="forward ctest_gpu"; preflight and build always run
#   SKIP_BUILD=1   use the build tree as it is (launch/gpu/run.sh)
#   <STEP>_TIMEOUT a step's limit in seconds, e.g. BUILD_TIMEOUT=420 TRAIN_TIMEOUT=150
#   KILL_AFTER     seconds from a step's TERM to its KILL (default 15)
#   TRAIN_STEPS    optimizer steps of the train steps (default 200)
#   DMD_STEPS      optimizer steps of the trajectory, dmd and dmd_colocated steps and their i2v
#                  twins (default 50)
#   PEAK_TFLOPS    dense bf16 peak for bench_forward's MFU (default 989: H100 SXM; the H200 has
#                  the same compute)
#   FORWARD_ARGS, STREAM_ARGS, CHECKPOINTING_ARGS, NCCL_ARGS, CTEST_ARGS: replace the defaults
#   BUILD_DIR (build-gpu), PYTHON (python3), WD_GPU_BUILD (the build command; default
#   launch/gpu/build.sh, replaced by the tests of this script)
# Writes into LOGS_DIR: summary.md (rewritten before and after every step), <step>.log for each
# step as it runs (preflight.log, build.log: configure and build), configure.log as it grows,
# <step>.ranks (world rank and exit code of each rank), and the train runs' metrics.jsonl,
# summary.json and diagnosis.txt. Into OUT: a copy of summary.md each time it is rewritten,
# logs.tar.gz (LOGS_DIR packed after every step) and the log of the step now running (it moves
# into LOGS_DIR when the step ends), so a command cut off still returns all it had.
# Exit code 0 once the summary is written; the verdicts are in it.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
repo=$PWD
t_start=$SECONDS

all_steps="smi nccl_init nccl train train_mpi oom train_stream train_ckpt train_bf16 colocated forward stream checkpointing ctest_gpu"
known_steps="$all_steps profile train2 lora lora_dmd shard_none_bf16 shard_optimizer shard_gradients shard_gradients_bf16 trajectory dmd dmd_colocated trajectory_i2v dmd_i2v sequence_parallel sequence_parallel_nccl shard_optimizer_nccl shard_gradients_nccl ctest"
steps=${STEPS:-$all_steps}
budget=${GPU_BUDGET_S:-560}
min_step=${MIN_STEP_S:-20}
kill_after=${KILL_AFTER:-15}
train_steps=${TRAIN_STEPS:-200}
dmd_steps=${DMD_STEPS:-50}
peak=${PEAK_TFLOPS:-989}
build=$(realpath -m "${BUILD_DIR:-build-gpu}")
publish=$(realpath -m "${OUT:-bench/results/gpu-raw}")
if [[ -n ${LOGS_DIR:-} ]]; then
  out=$(realpath -m "$LOGS_DIR")
elif [[ -n ${OUT:-} ]]; then
  out=$build/gpu-logs
  rm -rf "$out"  # an earlier command's logs on a warm machine went back with that command
else
  out=$publish
fi
bin=$build/src/app/wan-distill
build_cmd=${WD_GPU_BUILD:-bash $repo/launch/gpu/build.sh}

say() { echo "all.sh: $*" >&2; }

for s in $steps; do
  [[ " $known_steps " == *" $s "* ]] || { say "unknown step '$s'; steps: $known_steps"; exit 2; }
done
mkdir -p "$out" "$publish"

# --- Records and the summary -------------------------------------------------------------------
# Each step's record lives in R["<step>/<field>"] (status, rc, seconds, cmd, note, figures);
# summary.md is written from it in bash alone (forks cost tens of ms on a loaded machine).
read -r -a chosen <<<"$steps"
order=(preflight build "${chosen[@]}")
declare -A R=()
# record STEP STATUS RC SECONDS CMD NOTE FIGURES: sets the record and rewrites summary.md.
record() {
  R[$1/status]=$2
  R[$1/rc]=$3
  R[$1/seconds]=$4
  R[$1/cmd]=$5
  R[$1/note]=$6
  R[$1/figures]=$7
  write_summary
}

gpu_line=unknown
write_summary() {
  local s status used=$((SECONDS - t_start)) rest=()
  {
    echo "# wan-distill on a lent GPU: launch/gpu/all.sh"
    echo
    echo "- GPU: $gpu_line"
    echo "- started $start_text; this summary written at ${used} s of GPU_BUDGET_S=$budget"
    echo "- command: \`STEPS=\"$steps\" bash launch/gpu/all.sh\`; build tree \`$build\`"
    if [[ $out == "$publish" ]]; then
      echo "- logs: \`<step>.log\` beside this file (build.log: configure and build); \`configure.log\`"
    else
      echo "- logs: \`logs.tar.gz\` beside this file (\`<step>.log\`, build.log: configure and build, \`configure.log\`; packed from \`$out\` after every step), and the log of a step still running"
    fi
    echo
    echo "| step | status | exit | seconds | key figures | note |"
    echo "|---|---|---|---|---|---|"
    for s in "${order[@]}"; do
      status=${R[$s/status]:-not reached}
      if [[ $s != preflight && $s != build && ($status == "not run"* || $status == "not reached" || $status == running*) ]]; then
        rest+=("$s")
      fi
      echo "| $s | $status | ${R[$s/rc]:-} | ${R[$s/seconds]:-} | ${R[$s/figures]:-} | ${R[$s/note]:-} |"
    done
    echo
    echo "Commands:"
    echo
    for s in "${order[@]}"; do
      [[ -n ${R[$s/cmd]:-} && ${R[$s/cmd]} != - ]] && echo "- $s: \`${R[$s/cmd]}\`"
    done
    if ((${#rest[@]})); then
      echo
      echo "Not run here: \`STEPS=\"${rest[*]}\" bash launch/gpu/all.sh\` runs them next (the build again first on a fresh machine)."
    fi
  } >"$out/summary.md.tmp"
  mv "$out/summary.md.tmp" "$out/summary.md"
  if [[ $out != "$publish" ]]; then
    cp "$out/summary.md" "$publish/summary.md.tmp" && mv "$publish/summary.md.tmp" "$publish/summary.md"
  fi
}

# publish_step STEP: the step's log, written into OUT while it ran (through a link from
# LOGS_DIR), moves into LOGS_DIR, and OUT's logs.tar.gz is packed anew from LOGS_DIR.
publish_step() {
  [[ $out != "$publish" ]] || return 0
  if [[ -L $out/$1.log ]]; then
    rm -f "$out/$1.log"
    mv "$publish/$1.log" "$out/$1.log" 2>/dev/null || :
  fi
  local rc=0
  tar -C "$out" --exclude=summary.md.tmp --warning=no-file-changed -czf "$publish/logs.tar.gz.tmp" . 2>/dev/null || rc=$?
  # 1: a file grew while it was read (a rank of the step just ended still flushing its log):
  # the archive is whole and holds what was there; only a fatal error (2) keeps the old one.
  if ((rc <= 1)); then
    mv "$publish/logs.tar.gz.tmp" "$publish/logs.tar.gz"
  else
    rm -f "$publish/logs.tar.gz.tmp"
  fi
}

# --- Running a step --------------------------------------------------------------------------
# Every process a step starts carries WD_GPU_STEP_TAG in its environment, mpirun's setsid'd
# session and the ranks included; after the step, whatever still carries it is killed (a hung
# job would otherwise hold the GPU for the next step or the next command). The tag names this
# checkout, so a command only ever ends what this script started here.
tag_prefix="wd-gpu:$repo:"
# kill_tagged exact|prefix TAG: kills the processes whose WD_GPU_STEP_TAG is TAG (or starts with
# it), with their process groups unless the group is this script's. Prints how many it found.
kill_tagged() {
  local how=$1 tag=$2 f pid pgid own n=0 files
  own=$(ps_pgid $$)
  if [[ $how == exact ]]; then
    files=$(grep -lzxF "WD_GPU_STEP_TAG=$tag" /proc/[0-9]*/environ 2>/dev/null || true)
  else
    files=$(grep -lzF "WD_GPU_STEP_TAG=$tag" /proc/[0-9]*/environ 2>/dev/null || true)
  fi
  for f in $files; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    pgid=$(ps_pgid "$pid")
    if [[ -n $pgid && $pgid != "$own" && $pgid -gt 1 ]]; then kill -KILL -- "-$pgid" 2>/dev/null; fi
    kill -KILL "$pid" 2>/dev/null && n=$((n + 1))
  done
  echo "$n"
}
# ps_pgid PID: the process group of PID from /proc (no ps needed); empty when gone.
ps_pgid() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  awk '{ print $3 }' <<<"$stat"
}

step_timeout() {
  local var
  var=$(tr '[:lower:]' '[:upper:]' <<<"$1")_TIMEOUT
  echo "${!var:-$2}"
}

# run_step STEP DEFAULT_TIMEOUT NOTE CMD...: runs CMD into $out/STEP.log under the step's
# deadline (its timeout or what is left of the budget, whichever is less); sets step_rc and
# step_status ("ok", "failed", "timed out after N s", "unknown flag (...)") and step_seconds,
# or step_status "not run (...)" when the budget is spent. The caller records.
run_step() {
  local step=$1 timeout note=$3
  timeout=$(step_timeout "$1" "$2")
  shift 3
  # The step must end, KILL included, a few seconds before the budget does.
  local left=$((budget - (SECONDS - t_start)))
  local room=$((left - kill_after - 5))
  local limit=$((room < timeout ? room : timeout))
  step_cmd="$*"
  step_seconds=0
  step_rc=-
  if ((left < min_step || room < 5)); then
    step_status="not run (budget: ${left} s left of $budget)"
    return
  fi
  record "$step" "running (up to ${limit} s; if this stays, the command was cut off here)" - - "$step_cmd" "$note" ""
  say "$step: $step_cmd (up to ${limit}s) > $out/$step.log"
  if [[ $out != "$publish" ]]; then
    rm -f "$out/$step.log"
    : >"$publish/$step.log"
    ln -s "$publish/$step.log" "$out/$step.log"
  fi
  {
    echo "# $step_cmd"
    echo "# started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), limit ${limit}s"
  } >"$out/$step.log"
  local t0=$SECONDS
  WD_GPU_STEP_TAG="$tag_base:$step" WD_GPU_STEP=$step \
    timeout -k "$kill_after" "$limit" "$@" >>"$out/$step.log" 2>&1 </dev/null
  step_rc=$?
  step_seconds=$((SECONDS - t0))
  local killed
  killed=$(kill_tagged exact "$tag_base:$step")
  step_status=ok
  if ((step_rc == 124 || step_rc == 137)) && ((step_seconds >= limit)); then
    step_status="timed out after ${limit} s"
  elif ((step_rc != 0)); then
    step_status=failed
    local unknown
    unknown=$(grep -Eio "unrecogni[sz]ed option[^\"']*['\"][^'\"]*['\"]|unknown option[^\"']*['\"][^'\"]*['\"]" "$out/$step.log" | head -1 || true)
    [[ -n $unknown ]] && step_status="unknown flag ($unknown)"
  fi
  if ((killed > 0)); then
    step_status="$step_status; $killed leftover process(es) killed"
    echo "# all.sh: killed $killed process(es) of this step still running after it ended" >>"$out/$step.log"
  fi
}

# --- Key figures from a step's log ------------------------------------------------------------
# table_rows LOG: the data rows of the markdown tables in LOG, spaces squeezed.
table_rows() { grep -E '^\| *[^-| ]' "$1" | grep -vE '^\| *(size|placement|policy|step) *\|' | tr -s ' '; }
figures() {
  local step=$1 log=$out/$1.log
  [[ -f $log ]] || return 0
  case $step in
    preflight) sed -n 's/^preflight: //p' "$log" | tail -1 ;;
    profile) sed -n 's/^profile: //p' "$log" | tail -1 ;;
    build)
      local progress errors
      progress=$(grep -oE '^\[[0-9]+/[0-9]+\]' "$log" | tail -1)
      errors=$(grep -c 'error:' "$log")
      echo "ninja ${progress:-no progress line}; ${errors} compiler error line(s)$(grep -q 'configure skipped' "$out/configure.log" 2>/dev/null && echo '; configure skipped')"
      ;;
    smi) grep -E ', (Default|Exclusive_Process|Prohibited|Exclusive_Thread)$' "$log" | head -1 ;;
    nccl_init | ctest_gpu | ctest)
      local line skipped
      line=$(grep -E 'tests passed(, [0-9]+ tests? failed)? out of' "$log" | tail -1)
      skipped=$(grep -c '\*\*\*Skipped' "$log")
      echo "${line:-no CTest summary}; $skipped skipped"
      ;;
    nccl) table_rows "$log" | awk -F'|' '{ for (i = 2; i <= 5; i++) gsub(/^ +| +$/, "", $i); r = $0; s = $2; m = $3; n = $4; p = $5 } END { if (s != "") printf "%s: cudaMemcpy D2D %s GB/s, NCCL to self %s GB/s, rank 0 -> 1 %s", s, m, n, p }' ;;
    train | train_mpi | train_stream | train_ckpt | train_bf16 | colocated | train2 | trajectory | dmd | dmd_colocated | oom | \
      lora | lora_dmd | shard_* | *_i2v)
      local last eval ranks
      last=$(grep -oE 'step [0-9]+/[0-9]+ loss [0-9.e+-]+.*samples/s' "$log" | tail -1 | sed -E 's/ lr [^ ]+//')
      eval=$(grep -oE 'eval after training: relative MSE [0-9.e+-]+' "$log" | tail -1 | sed 's/eval after training: //')
      ranks=$(sort -n "$out/$step.ranks" 2>/dev/null | awk '{ printf "%s%s:%s", (NR > 1 ? " " : ""), $1, $2 }')
      echo "${last:-no step line}${eval:+; $eval}; rank:exit ${ranks:-none recorded}"
      ;;
    forward) table_rows "$log" | awk -F'|' '{ gsub(/ /, "", $7); gsub(/ /, "", $11); gsub(/ /, "", $12); printf "%s%s ms/forward, %s GFLOP/s, MFU %s", (NR > 1 ? "; " : ""), $7, $11, $12 }' ;;
    stream) table_rows "$log" | awk -F'|' '{ gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $6); printf "%s%s%s %s ms (%s%s)", (NR > 1 ? "; " : ""), $2, ($3 == "-" ? "" : " ahead " $3), $4, $5, ($6 == "-" ? "" : ", waited " $6 " ms") }' ;;
    checkpointing) table_rows "$log" | awk -F'|' '{ gsub(/ /, "", $2); gsub(/ /, "", $4); gsub(/ /, "", $7); printf "%s%s %s MiB %s s", (NR > 1 ? "; " : ""), $2, $4, $7 }' ;;
  esac
}

# first_error LOG: the first line of LOG that reports an error (the program's own [error] lines
# first, else any that says so, else the last line), without the timestamp, cut to 200 characters.
first_error() {
  local line
  line=$(grep -v '^#' "$1" 2>/dev/null | grep -m1 -E '\[(error|critical)\]') ||
    line=$(grep -v '^#' "$1" 2>/dev/null | grep -m1 -E 'error|Error|ERROR|FAIL|what\(\)|Aborted|Segmentation') ||
    line=$(grep -v '^#' "$1" 2>/dev/null | grep . | tail -1) || return 0
  line=${line#\[*\] }
  line=${line#"${line%%[! ]*}"}
  echo "${line:0:200}"
}

finish_step() {  # STEP [NOTE]: records the step from run_step's results.
  local fig err
  fig=$(figures "$1" | head -c 400)
  if [[ $step_status != ok* && $step_status != "not run"* ]]; then
    err=$(first_error "$out/$1.log")
    [[ -n $err ]] && fig="${fig:+$fig; }first error: $err"
  fi
  record "$1" "$step_status" "$step_rc" "$step_seconds" "$step_cmd" "${2:-}" "$(tr '|' '/' <<<"$fig")"
  publish_step "$1"
}

skip() {  # STEP STATUS NOTE
  record "$1" "$2" - 0 - "$3" ""
}

# --- The steps ----------------------------------------------------------------------------------
# train_step STEP NP TIMEOUT NOTE FLAGS...: wan-distill train under launch/mpirun.sh, each rank
# wrapped so that its exit code lands in $out/STEP.ranks (the wrapper's trap keeps it alive
# through mpirun's TERM to write it); the run's metrics, summary and diagnosis copied to $out.
train_step() {
  local step=$1 np=$2 timeout=$3 note=$4
  shift 4
  if [[ ! -x $bin ]]; then
    skip "$step" "missing" "$bin not built"
    return
  fi
  if ((np > 1)) && [[ $compute_mode != Default && $compute_mode != unknown ]]; then
    skip "$step" "skipped" "compute mode $compute_mode: $np processes cannot share the GPU"
    return
  fi
  local dir=$out/$step-run
  rm -rf "$dir"
  mkdir -p "$dir"
  export WD_RANK_EXITS=$out/$step.ranks
  : >"$WD_RANK_EXITS"
  # shellcheck disable=SC2016  # expanded by each rank's bash
  run_step "$step" "$timeout" "$note" bash "$repo/launch/mpirun.sh" -np "$np" \
    bash -c 'trap true TERM INT; "$@"; rc=$?; echo "${OMPI_COMM_WORLD_RANK:-?} $rc" >>"$WD_RANK_EXITS"; exit $rc' wd-rank \
    "$bin" train --run-dir "$dir" "$@"
  step_cmd="bash launch/mpirun.sh -np $np $bin train --run-dir $dir $*"
  for f in diagnosis.txt summary.json metrics.jsonl; do
    [[ -f $dir/$f ]] && cp "$dir/$f" "$out/$step.$f"
  done
  rm -rf "$dir"  # the student checkpoint and caches: large, and not evidence
  if [[ $step == oom && $step_status != "not run"* ]]; then
    # Judged against the documented exit code 4 on every rank.
    local fours killed=""
    fours=$(awk '$2 == 4' "$WD_RANK_EXITS" | wc -l)
    [[ $step_status == *leftover* ]] && killed="; ${step_status#*; }"
    if ((fours == np)); then
      step_status="ok (exit 4 on every rank, as documented)$killed"
    else
      step_status="failed (expected exit 4 on each of $np ranks, $fours did; the job: $step_status)"
    fi
  fi
  finish_step "$step" "$note"
}

# bench_step STEP TIMEOUT PROGRAM ARGS...
bench_step() {
  local step=$1 timeout=$2 prog=$3
  shift 3
  if [[ ! -x $prog ]]; then
    skip "$step" "missing" "$prog not built"
    return
  fi
  run_step "$step" "$timeout" "" "$prog" "$@"
  finish_step "$step"
}

# targets_for STEP: the ninja targets STEP needs (ctest_gpu builds its own in its step).
targets_for() {
  case $1 in
    nccl_init) echo test_nccl_mpi ;;
    nccl) echo nccl_bandwidth ;;
    train | train_mpi | oom | train_stream | train_ckpt | train_bf16 | colocated | train2 | trajectory | dmd | \
      dmd_colocated | trajectory_i2v | dmd_i2v | sequence_parallel | sequence_parallel_nccl | shard_optimizer_nccl | \
      shard_gradients_nccl) echo wan-distill ;;
    forward) echo bench_forward ;;
    stream) echo bench_stream ;;
    profile) echo bench_forward bench_stream ;;
    checkpointing) echo bench_checkpointing ;;
    ctest) echo all ;;
  esac
}

# gpu_test_targets: the build-tree programs the CTest tests labelled gpu start, as ninja
# targets (paths relative to the build tree that ninja knows); "all" when CTest cannot say.
gpu_test_targets() {
  local json known
  json=$(ctest --test-dir "$build" -L '^gpu$' --show-only=json-v1 2>/dev/null) || { echo all; return; }
  known=$(ninja -C "$build" -t targets all 2>/dev/null | cut -d: -f1)
  [[ -n $known ]] || { echo all; return; }
  "${PYTHON:-python3}" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
names = set()
for test in json.load(sys.stdin).get("tests", []):
    for word in test.get("command", []):
        path = os.path.realpath(word)
        if path.startswith(build + os.sep):
            names.add(os.path.relpath(path, build))
print("\n".join(sorted(names)))
' "$build" <<<"$json" 2>/dev/null | grep -Fxf <(echo "$known") | paste -sd' '
}

start_epoch=$(date +%s)
start_text=$(date -u -d "@$start_epoch" '+%Y-%m-%d %H:%M:%S UTC')
tag_base="$tag_prefix$$-$start_epoch"
compute_mode=unknown
gpu_count=0
for s in "${order[@]}"; do
  rm -f "$out/$s.log" "$out/$s.ranks" "$out/$s.diagnosis.txt" "$out/$s.summary.json" "$out/$s.metrics.jsonl"
done
write_summary

# A command cut off earlier on this (warm) machine may have left a job holding the GPU.
stale=$(kill_tagged prefix "$tag_prefix")
((stale > 0)) && say "killed $stale process(es) left by an earlier command"

# Preflight: always; its failure stops the build, and the steps are then not run.
run_step preflight "60" "" env BUILD_DIR="$build" bash "$repo/launch/gpu/preflight.sh"
preflight_ok=no
[[ $step_status == ok ]] && preflight_ok=yes
if [[ -f $build/preflight.env ]]; then
  compute_mode=$(sed -n 's/^WD_GPU_COMPUTE_MODE=//p' "$build/preflight.env")
  gpu_count=$(sed -n 's/^WD_GPU_COUNT=//p' "$build/preflight.env")
  [[ $gpu_count =~ ^[0-9]+$ ]] || gpu_count=0
  gpu_line="$(sed -n 's/^WD_GPU_NAME=//p' "$build/preflight.env" | tr -d '"') x$(sed -n 's/^WD_GPU_COUNT=//p' "$build/preflight.env"), compute mode $compute_mode"
fi
finish_step preflight

# Build: the targets of the chosen steps, resumable (ninja); its logs land in $OUT as they grow.
targets=$(for s in $steps; do targets_for "$s"; done | sort -u | paste -sd' ')
if [[ -n ${SKIP_BUILD:-} ]]; then
  skip build "skipped" "SKIP_BUILD set: the tree as it is"
elif [[ $preflight_ok != yes ]]; then
  skip build "not run" "preflight failed: see preflight.log"
elif [[ -z $targets ]]; then
  skip build "skipped" "no chosen step needs a program"
else
  # shellcheck disable=SC2086  # build_cmd is a command line ("bash .../build.sh")
  run_step build 540 "targets: $targets" env BUILD_DIR="$build" TARGETS="$targets" LOG_DIR="$out" $build_cmd
  finish_step build "targets: $targets"
fi
build_ok=no
[[ ${R[build/status]} == ok || ${R[build/status]} == skipped* ]] && build_ok=yes
if [[ -f $build/gpu-env.sh ]]; then
  # shellcheck source=/dev/null
  . "$build/gpu-env.sh"
fi

for s in $steps; do
  if [[ $build_ok != yes ]]; then
    skip "$s" "not run" "the build did not finish: see build.log"
    continue
  fi
  case $s in
    smi)
      if command -v nvidia-smi >/dev/null; then
        run_step smi 30 "" bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_mode --format=csv,noheader'
        finish_step smi
      else
        skip smi "missing" "nvidia-smi not on PATH"
      fi
      ;;
    nccl_init)
      if [[ -x $build/tests/test_nccl_mpi ]]; then
        run_step nccl_init 120 "NCCL's first start, one rank" ctest --test-dir "$build" -R '^test_nccl_mpi_gpu_np1$' --output-on-failure
        finish_step nccl_init "NCCL's first start, one rank"
      else
        skip nccl_init "missing" "$build/tests/test_nccl_mpi not built (needs NCCL at configure time)"
      fi
      ;;
    nccl)
      if [[ -x $build/bench/nccl_bandwidth ]]; then
        # One rank: two ranks on one GPU is a duplicate-GPU error for NCCL.
        # shellcheck disable=SC2086  # NCCL_ARGS is a list of flags
        run_step nccl 90 "one rank (send/recv to self)" bash "$repo/launch/mpirun.sh" -np 1 "$build/bench/nccl_bandwidth" ${NCCL_ARGS:-}
        finish_step nccl "one rank (send/recv to self)"
      else
        skip nccl "missing" "$build/bench/nccl_bandwidth not built (needs NCCL at configure time)"
      fi
      ;;
    train)
      train_step train 2 150 "1 teacher + 1 student on one GPU" --student.device cuda --teacher.placement gpu \
        --train.steps "$train_steps"
      ;;
    train_mpi)
      train_step train_mpi 2 120 "as train, gradients and link over MPI" --student.device cuda --teacher.placement gpu \
        --train.steps "$train_steps" --comm.backend mpi
      ;;
    oom)
      # A dim-2048, 8-block student at 2048 samples x 192 tokens per step needs several hundred
      # GB of activations: more than any one GPU has. eval_samples must divide by the batch.
      # shellcheck disable=SC2086  # OOM_ARGS is a list of flags
      train_step oom 2 120 "expected: exit 4 on every rank" --student.device cuda --teacher.placement gpu \
        --train.steps 3 --train.batch_size "${OOM_BATCH:-2048}" --train.eval_samples 0 \
        --data.builtin_samples "${OOM_BATCH:-2048}" --student.dim 2048 --student.num_heads 16 \
        --student.num_layers 8 --student.ffn_dim 8192 ${OOM_ARGS:-}
      ;;
    train_stream)
      train_step train_stream 2 120 "teacher blocks streamed by the CUDA copy engine" --student.device cuda \
        --teacher.placement stream --train.steps "$train_steps"
      ;;
    train_ckpt)
      train_step train_ckpt 2 120 "every student block recomputed in the backward" --student.device cuda \
        --teacher.placement gpu --student.checkpointing all --train.steps "$train_steps"
      ;;
    train_bf16)
      train_step train_bf16 2 120 "bf16 compute, fp32 master weights" --student.device cuda \
        --teacher.placement gpu --student.precision bf16-mixed --train.steps "$train_steps"
      ;;
    colocated)
      # in_dim 32 against the teacher's 16 makes the student project its inputs (x_t from the
      # host against a CUDA projection); sampling probes multiply σ by the teacher's output.
      train_step colocated 1 120 "teacher on the student's rank; projected inputs, sampling probes" \
        --student.device cuda --teacher.placement colocated --student.in_dim 32 --train.sample_every 10 \
        --train.steps "$train_steps"
      ;;
    train2)
      train_step train2 3 150 "1 teacher + 2 students on one GPU" --student.device cuda --teacher.placement gpu \
        --train.steps "$train_steps"
      ;;
    shard_none_bf16 | shard_optimizer | shard_gradients | shard_gradients_bf16)
      # 1 teacher + 2 students, student.shard over MPI (the students share the one GPU, so the
      # backend choice is MPI through pinned host memory); compare the loss with train2's.
      mode=${s#shard_}
      precision=fp32
      [[ $mode == *_bf16 ]] && precision=bf16-mixed && mode=${mode%_bf16}
      train_step "$s" 3 150 "1 teacher + 2 students, student.shard $mode, $precision" --student.device cuda \
        --teacher.placement gpu --student.shard "$mode" --student.precision "$precision" --comm.backend mpi \
        --memory.report_every 100 --train.steps "$train_steps"
      ;;
    lora)
      train_step lora 2 150 "a LoRA student (rank 8 over the teacher's bf16 base on the GPU), guided" \
        --student.device cuda --teacher.placement gpu --student.lora_rank 8 --train.objective guided \
        --train.lr 2e-3 --train.steps "$train_steps"
      ;;
    lora_dmd)
      train_step lora_dmd 2 150 "dmd with a LoRA generator and critic over one base on the GPU" \
        --student.device cuda --teacher.placement gpu --student.lora_rank 8 --train.objective dmd \
        --student.checkpointing all --train.steps "$dmd_steps"
      ;;
    trajectory)
      train_step trajectory 2 150 "the teacher's 40-step guided sampler on the GPU, 4-step student" \
        --student.device cuda --teacher.placement gpu --train.objective trajectory --train.steps "$dmd_steps"
      ;;
    dmd)
      train_step dmd 2 150 "critic on the GPU; the teacher rank answers real-score requests" --student.device cuda \
        --teacher.placement gpu --train.objective dmd --train.steps "$dmd_steps"
      ;;
    trajectory_i2v | dmd_i2v)
      # A tiny i2v teacher (in_dim 36: 16 noisy + 4 mask + 16 image latent channels); train makes
      # its builtin data set with each sample's image.
      i2v_teacher=$build/i2v-teacher
      [[ -f $i2v_teacher/config.json ]] || "$bin" init-teacher --preset tiny --model-type i2v --in-dim 36 \
        --out-dim 16 --dtype bf16 --seed 4 --output "$i2v_teacher" >"$out/$s.init.log" 2>&1
      train_step "$s" 2 150 "an i2v teacher's ${s%_i2v} on the GPU: y in every teacher and student forward" \
        --teacher.checkpoint "$i2v_teacher" --student.device cuda --teacher.placement gpu \
        --train.objective "${s%_i2v}" --train.steps "$dmd_steps"
      ;;
    sequence_parallel)
      train_step sequence_parallel 3 150 "1 teacher + a group of 2 students sharing the GPU: all-to-all over MPI" \
        --student.device cuda --teacher.placement gpu --student.sequence_parallel 2 --comm.backend mpi \
        --train.steps "$train_steps"
      ;;
    sequence_parallel_nccl)
      if ((gpu_count < 2)); then
        skip sequence_parallel_nccl "skipped" "needs 2 GPUs ($gpu_count visible): NCCL refuses two ranks of one communicator on one GPU"
      else
        # comm.backend auto: NCCL between ranks on distinct GPUs (the group's all-to-all, the
        # gradient all-reduce), MPI where a student shares the teacher's GPU.
        train_step sequence_parallel_nccl 3 150 "1 teacher + a group of 2 students on $gpu_count GPUs: all-to-all over NCCL" \
          --student.device cuda --teacher.placement gpu --student.sequence_parallel 2 --comm.backend auto \
          --train.steps "$train_steps"
      fi
      ;;
    shard_optimizer_nccl | shard_gradients_nccl)
      mode=${s#shard_}
      mode=${mode%_nccl}
      if ((gpu_count < 2)); then
        skip "$s" "skipped" "needs 2 GPUs ($gpu_count visible): NCCL refuses two ranks of one communicator on one GPU"
      else
        # comm.backend auto: the two students on distinct GPUs, so ZeRO's reduce-scatter and
        # all-gather (and the optimizer mode's all-reduce) go over NCCL.
        train_step "$s" 3 150 "1 teacher + 2 students on $gpu_count GPUs, student.shard $mode over NCCL" \
          --student.device cuda --teacher.placement gpu --student.shard "$mode" --comm.backend auto \
          --memory.report_every 100 --train.steps "$train_steps"
      fi
      ;;
    dmd_colocated)
      train_step dmd_colocated 1 150 "dmd with the teacher on the student's rank (local answers)" \
        --student.device cuda --teacher.placement colocated --train.objective dmd --train.steps "$dmd_steps"
      ;;
    forward)
      # Wan 2.2 TI2V-5B at 480p: 81 frames -> 21 latent frames of 30x52 (VAE 4x16x16), 8190
      # tokens with the (1,2,2) patch.
      # shellcheck disable=SC2206  # FORWARD_ARGS is a list of flags
      args=(${FORWARD_ARGS:---sizes wan22-ti2v-5b --dtypes bf16 --threads 1 --frames 21 --height 30 --width 52 --warmup 2 --runs 5 --peak-tflops $peak})
      bench_step forward 180 "$build/bench/bench_forward" --device cuda "${args[@]}"
      ;;
    stream)
      # shellcheck disable=SC2206
      args=(${STREAM_ARGS:---batch 1 --frames 21 --height 30 --width 52})
      bench_step stream 120 "$build/bench/bench_stream" --device cuda "${args[@]}"
      ;;
    profile)
      # One file, profile.md, in LOGS_DIR (so in logs.tar.gz): OUT returns at most 8 files.
      run_step profile 330 "kernels, blocks and streaming at real dims: profile.md in logs.tar.gz" \
        env BUILD_DIR="$build" OUT_DIR="$out" PEAK_TFLOPS="$peak" bash "$repo/launch/gpu/profile.sh"
      finish_step profile "kernels, blocks and streaming at real dims: profile.md in logs.tar.gz"
      ;;
    checkpointing)
      # shellcheck disable=SC2206
      args=(${CHECKPOINTING_ARGS:---layers 8 --dim 1536 --heads 12 --ffn 8960 --batch 2 --frames 21 --height 30 --width 52})
      bench_step checkpointing 120 "$build/bench/bench_checkpointing" --device cuda "${args[@]}"
      ;;
    ctest_gpu)
      # The gpu-labelled tests' programs are built here, not in the build step, so that they
      # do not delay the steps above.
      tests_targets=$(gpu_test_targets)
      # shellcheck disable=SC2086,SC2016  # CTEST_ARGS is a list; the script's $1, $2 are its own
      run_step ctest_gpu 300 "targets: ${tests_targets:-none}" bash -c \
        'set -e; [[ -z $2 ]] || cmake --build "$1" --target $2; shift 2; ctest "$@"' wd-ctest \
        "$build" "$tests_targets" --test-dir "$build" -L '^gpu$' --output-on-failure --parallel 2 ${CTEST_ARGS:-}
      finish_step ctest_gpu "targets: ${tests_targets:-none}"
      ;;
    ctest)
      # shellcheck disable=SC2086
      run_step ctest 540 "the whole suite" ctest --test-dir "$build" --output-on-failure --parallel 8 ${CTEST_ARGS:-}
      finish_step ctest "the whole suite"
      ;;
  esac
done

write_summary
publish_step -
say "summary: $out/summary.md ($((SECONDS - t_start)) s)"
cat "$out/summary.md"
exit 0
