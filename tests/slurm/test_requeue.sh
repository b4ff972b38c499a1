#!/usr/bin/env bash
# Requeue: once the tiny job has trained some steps, its batch shell gets SIGUSR1 (scancel
# --signal=USR1 --batch, what --signal=B:USR1@T delivers before the time limit). The ranks must
# stop after the same step with a checkpoint and exit 75, the template must requeue the job, and
# the second run must resume from that checkpoint and complete: every step 1..STEPS trained and
# logged exactly once. Usage: test_requeue.sh WD_BIN [srun|mpirun]
source "$(dirname "$0")/lib.sh"
launcher=${2:-srun}
slurm_test "requeue${2:+_$2}" "$1"
cluster_start 1 4 || fail "the cluster did not start"

steps=200
# mpirun idles 2 x its kill grace after the ranks exit 75 (slurm/train-step.sh): keep it short.
export WD_KILL_GRACE=5
run=$CLUSTER_DIR/run
job=$(LAUNCHER=$launcher EXTRA_ARGS="--train.steps $steps --train.log_every 1" submit slurm/train-1node.sbatch "$run" \
      --ntasks-per-node=3 --gpus-per-node=3) || fail "sbatch failed"
metrics=$run/metrics.jsonl
# Signal once training is under way (20 steps logged), well before it could finish.
usr1_once "$job" 90 "20 logged steps" bash -c "[[ \$(grep -c '\"loss\"' '$metrics' 2>/dev/null) -ge 20 ]]"
echo "slurm.$TEST_NAME: sent SIGUSR1 after step $(logged_steps "$metrics" | tail -1)"

# The requeued job waits cred_expire (10 s in the test cluster) before it starts again.
requeued_once "$job" 240
out=$CLUSTER_DIR/jobs/$job.out
grep -q "exit 75); requeueing" "$out" || fail "the first run did not end with the requeue code 75"
first_log=$(rank_log "$run" "$job" 0 1 "$launcher")   # student 0 writes the checkpoints
second_log=$(rank_log "$run" "$job" 1 0 "$launcher")
stop=$(sed -n 's/.*checkpoint of step \([0-9]*\) written.*/\1/p' "$first_log" | tail -1)
[[ -n $stop ]] || fail "the first run wrote no checkpoint"
for r in 0 1 2; do
  grep -q "exiting with code 75" "$(rank_log "$run" "$job" 0 "$r" "$launcher")" ||
    fail "rank $r of the first run did not exit with the requeue code 75"
done
grep -q "resuming from .*step-$(printf %08d "$stop") (step $stop)" "$second_log" ||
  fail "the second run did not resume from the checkpoint of step $stop"
((stop > 0 && stop < steps)) || fail "stopped at step $stop"

# Every step exactly once, in order, across both runs.
logged_steps "$metrics" >"$CLUSTER_DIR/steps.txt"
seq 1 "$steps" | cmp -s - "$CLUSTER_DIR/steps.txt" || {
  dupes=$(sort -n "$CLUSTER_DIR/steps.txt" | uniq -d | head -5 | paste -sd,)
  fail "logged steps are not 1..$steps once each ($(wc -l <"$CLUSTER_DIR/steps.txt") lines; repeated: ${dupes:-none})"
}
[[ -d $run/checkpoints/step-$(printf %08d "$steps") ]] || fail "no final checkpoint"
pass "job $job ($launcher): SIGUSR1 -> checkpoint at step $stop, exit 75, requeued, resumed, COMPLETED at step $steps; steps 1..$steps once each"
