#!/usr/bin/env bash
# Failure: student 0 runs out of memory at step 3 (--inject-fault oom@student:0:3). The job
# must end FAILED with exit code 4 within the deadline, the job log must hold the diagnosis,
# and every rank must have run the failure protocol ("exiting with code 4"), not have been
# killed first by srun --kill-on-bad-exit. Usage: test_failure.sh WD_BIN
source "$(dirname "$0")/lib.sh"
slurm_test failure "$1"
cluster_start 1 4 || fail "the cluster did not start"

deadline=120
run=$CLUSTER_DIR/run
job=$(EXTRA_ARGS="--train.steps 50 --inject-fault oom@student:0:3" submit slurm/train-1node.sbatch "$run" \
      --ntasks-per-node=3 --gpus-per-node=3) || fail "sbatch failed"
t0=$SECONDS
wait_state "$job" "$deadline" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
took=$((SECONDS - t0))
state=$(job_field "$job" JobState)
[[ $state == FAILED ]] || fail "job $job ended $state, expected FAILED"
[[ $(job_field "$job" ExitCode) == 4:0 ]] || fail "exit code $(job_field "$job" ExitCode), expected 4:0 (out of memory)"
[[ $(job_field "$job" Restarts) == 0 ]] || fail "a failed job must not be requeued"

out=$CLUSTER_DIR/jobs/$job.out
grep -q "wan-distill train stopped: diagnosis" "$out" || fail "no diagnosis in the job log $out"
grep -q "training stopped with exit code 4" "$out" || fail "the job log does not name exit code 4"
[[ -f $run/diagnosis.txt ]] || fail "no $run/diagnosis.txt"
for r in 0 1 2; do
  grep -q "exiting with code 4" "$run/logs/job-$job-run-0/rank-$r.log" ||
    fail "rank $r did not exit with code 4 through the failure protocol"
done
pass "job $job FAILED with exit code 4 after ${took} s; diagnosis in the job log; all 3 ranks exited with 4"
