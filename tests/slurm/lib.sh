#!/usr/bin/env bash
# What the SLURM test drivers share: a private cluster (cluster.sh), submitting the sbatch
# templates with the tiny job, bounded waits on job states, and one PASS/FAIL line per test.
# A driver: source lib.sh; slurm_test NAME WD_BIN; cluster_start ...; ...; pass
set -uo pipefail

SLURM_TEST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=cluster.sh
source "$SLURM_TEST_ROOT/tests/slurm/cluster.sh"

# slurm_test NAME WD_BIN: names the test (for its PASS/FAIL line) and the binary under test.
slurm_test() {
  TEST_NAME=$1
  WD_BIN=$(realpath "$2")
  TEST_START=$SECONDS
  [[ -x $WD_BIN ]] || fail "no executable $WD_BIN"
  # CTest reports exit code 77 as skipped (SKIP_RETURN_CODE): a machine without SLURM or root.
  local tool
  for tool in slurmctld slurmd munged mungekey sbatch; do
    command -v "$tool" >/dev/null || { echo "slurm.$TEST_NAME: SKIP: $tool not installed (apt-get install slurm-wlm munge)"; exit 77; }
  done
  if [[ $(id -u) -ne 0 ]]; then echo "slurm.$TEST_NAME: SKIP: the private cluster needs root"; exit 77; fi
  echo "slurm.$TEST_NAME: start"
}

# Prints what helps to see why a test failed: job records, job output, rank logs, daemon logs.
dump_logs() {
  [[ -n ${CLUSTER_DIR:-} && -d $CLUSTER_DIR ]] || return 0
  echo "---- scontrol show job"
  scontrol show job 2>&1 | head -80
  local f
  for f in "$CLUSTER_DIR"/jobs/*.out "$CLUSTER_DIR"/run*/logs/*/rank-*.log "$CLUSTER_DIR"/run*/logs/*/1/rank.*/stderr; do
    [[ -f $f ]] || continue
    echo "---- $f (last 40 lines)"
    tail -n 40 "$f"
  done
  for f in "$CLUSTER_DIR"/log/slurmctld.log "$CLUSTER_DIR"/log/slurmd-*.log; do
    [[ -f $f ]] || continue
    echo "---- $f (errors)"
    grep -i error "$f" | tail -n 15
  done
}

fail() {
  echo "slurm.${TEST_NAME:-?}: FAIL: $*"
  dump_logs
  echo "slurm.${TEST_NAME:-?}: FAIL ($((SECONDS - ${TEST_START:-0})) s): $*"
  exit 1
}

pass() {
  echo "slurm.$TEST_NAME: PASS ($((SECONDS - TEST_START)) s)${1:+: $1}"
  exit 0
}

# What every job a test submits assumes, as tests/launch/launch_util.hpp pins it: one intra-op
# thread per rank and the students and teacher on the host, even where a GPU is visible.
CPU_JOB_ARGS="--runtime.threads 1 --student.device cpu --teacher.placement cpu --teacher.device cpu"

# submit TEMPLATE RUN_DIR [sbatch options...]: submits a template with the builtin tiny job
# (CONFIG empty, 1 teacher rank) pinned to the host (CPU_JOB_ARGS); EXTRA_ARGS, TEACHER_RANKS
# and the OMPI_* settings in the environment pass through to the job. Prints the job id.
submit() {
  local template=$1 run_dir=$2
  shift 2
  mkdir -p "$CLUSTER_DIR/jobs"
  CONFIG="" TEACHER_RANKS=${TEACHER_RANKS:-1} RUN_DIR=$run_dir WD_BIN=$WD_BIN WD_ROOT=$SLURM_TEST_ROOT \
    EXTRA_ARGS="$CPU_JOB_ARGS ${EXTRA_ARGS:-}" \
    sbatch --parsable --chdir="$CLUSTER_DIR" --output="$CLUSTER_DIR/jobs/%j.out" --time=20 \
    --cpus-per-task=1 "$@" "$SLURM_TEST_ROOT/$template"
}

# job_field JOBID FIELD: one field of `scontrol show job` (JobState, ExitCode, Restarts, ...).
job_field() {
  scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# wait_state JOBID TIMEOUT STATE...: waits until the job is in one of STATEs; fails the test
# on timeout (naming the state it is in).
wait_state() {
  local job=$1 timeout=$2
  shift 2
  local deadline=$((SECONDS + timeout)) state=""
  while ((SECONDS < deadline)); do
    state=$(job_field "$job" JobState)
    local s
    for s in "$@"; do [[ $state == "$s" ]] && return 0; done
    sleep 1
  done
  fail "job $job still $state after ${timeout}s (waited for $*)"
}

# wait_for TIMEOUT WHAT COMMAND...: waits until COMMAND succeeds; fails the test on timeout.
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for $what"
    sleep 0.5
  done
}

# usr1_once JOBID TIMEOUT WHAT COMMAND...: once the job runs and COMMAND succeeds (wait_for),
# sends its batch shell SIGUSR1 (what --signal=B:USR1@T delivers before the time limit).
usr1_once() {
  local job=$1 timeout=$2 what=$3
  shift 3
  wait_state "$job" 60 RUNNING
  wait_for "$timeout" "$what" "$@"
  scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 --batch failed"
}

# requeued_once JOBID TIMEOUT: waits for the job to end; fails the test unless it COMPLETED after
# exactly one requeue, its batch shell having forwarded SIGUSR1 to the ranks.
requeued_once() {
  local job=$1 timeout=$2
  wait_state "$job" "$timeout" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
  local state
  state=$(job_field "$job" JobState)
  [[ $state == COMPLETED ]] || fail "job $job ended $state (exit $(job_field "$job" ExitCode))"
  [[ $(job_field "$job" Restarts) == 1 ]] || fail "Restarts=$(job_field "$job" Restarts), expected 1"
  grep -q "SIGUSR1: asking the ranks to checkpoint and stop" "$CLUSTER_DIR/jobs/$job.out" ||
    fail "the batch shell did not forward SIGUSR1"
}

# rank_log RUN_DIR JOB RUN RANK LAUNCHER: the log file of one rank of one run (the templates'
# layout: srun --output per rank, or Open MPI's --output-filename tree, where spdlog's lines
# are in stderr).
rank_log() {
  if [[ $5 == mpirun ]]; then
    echo "$1/logs/job-$2-run-$3/1/rank.$4/stderr"
  else
    echo "$1/logs/job-$2-run-$3/rank-$4.log"
  fi
}

# The training step numbers logged in a metrics.jsonl, one per line, in file order.
logged_steps() {
  grep '"loss"' "$1" | sed -n 's/.*"step":\([0-9]*\).*/\1/p'
}

# The held-out relative MSE values in a metrics.jsonl, in file order.
eval_errors() {
  sed -n 's/.*"rel_mse":\([-0-9.eE+]*\).*/\1/p' "$1"
}
