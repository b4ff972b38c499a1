#!/usr/bin/env bash
# One node: sbatch the single-node template (srun --mpi=pmix) with the tiny job on 3 ranks;
# the job must end COMPLETED with the student, a checkpoint and metrics, and the held-out
# error must have fallen. Usage: test_one_node.sh WD_BIN
source "$(dirname "$0")/lib.sh"
slurm_test one_node "$1"
cluster_start 1 4 || fail "the cluster did not start"

run=$CLUSTER_DIR/run
job=$(EXTRA_ARGS="--train.steps 60" submit slurm/train-1node.sbatch "$run" \
      --ntasks-per-node=3 --gpus-per-node=3) || fail "sbatch failed"
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
state=$(job_field "$job" JobState)
[[ $state == COMPLETED ]] || fail "job $job ended $state (exit $(job_field "$job" ExitCode))"
[[ $(job_field "$job" ExitCode) == 0:0 ]] || fail "exit code $(job_field "$job" ExitCode)"

[[ -f $run/student/config.json ]] || fail "no student in $run/student"
ls "$run"/student/*.safetensors >/dev/null 2>&1 || fail "no student weights in $run/student"
[[ -d $run/checkpoints/step-00000060 ]] || fail "no checkpoint of step 60 in $run/checkpoints"
[[ -s $run/metrics.jsonl ]] || fail "no metrics.jsonl"
last=$(logged_steps "$run/metrics.jsonl" | tail -1)
[[ $last == 60 ]] || fail "last logged step $last, expected 60"
mapfile -t err < <(eval_errors "$run/metrics.jsonl")
((${#err[@]} >= 2)) || fail "fewer than two evaluations in metrics.jsonl"
awk -v a="${err[0]}" -v b="${err[-1]}" 'BEGIN { exit !(b < a) }' ||
  fail "held-out error did not fall: ${err[0]} -> ${err[-1]}"
ls "$run"/logs/job-"$job"-run-0/rank-{0,1,2}.log >/dev/null || fail "missing per-rank logs"
pass "job $job COMPLETED, held-out relative MSE ${err[0]} -> ${err[-1]}"
