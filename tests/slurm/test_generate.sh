#!/usr/bin/env bash
# generate under SLURM (slurm/generate.sbatch): 3 ranks write a trajectory cache of the tiny job;
# once some shards are in, the batch shell gets SIGUSR1 (what --signal=B:USR1@T delivers before
# the time limit). Every rank must stop between two shards and exit 75, the template must requeue
# the job, and the second run must keep the complete shards, write the rest and the index:
# a complete cache, which a train with the same keys then reads. Usage: test_generate.sh WD_BIN
source "$(dirname "$0")/lib.sh"
slurm_test generate "$1"
cluster_start 1 4 || fail "the cluster did not start"

export WD_KILL_GRACE=5
run=$CLUSTER_DIR/run
cache=$CLUSTER_DIR/cache
# 200 training messages of a k = 4 student of the tiny teacher at 40 guided steps, 4 a shard:
# 1 held-out and 50 training shards, each a round of 4 x 2 trajectories' 40 steps.
keys="--train.objective trajectory --teacher.guidance 3 --teacher.steps 40 --student.steps 4"
job=$(OUTPUT=$cache EXTRA_ARGS="$keys --train.steps 200 --shard-positions 4" submit slurm/generate.sbatch "$run" \
      --ntasks-per-node=3 --gpus-per-node=3) || fail "sbatch failed"
# Signal once 3 shards are in, well before the 51 could be.
usr1_once "$job" 120 "3 complete shards" bash -c "(( \$(ls '$cache'/*.h5.json 2>/dev/null | wc -l) >= 3 ))"
echo "slurm.$TEST_NAME: sent SIGUSR1 with $(ls "$cache"/*.h5.json | wc -l) shard(s) complete"

requeued_once "$job" 300
out=$CLUSTER_DIR/jobs/$job.out
grep -q "ranks stopped between shards (exit 75); requeueing" "$out" || fail "the first run did not end with 75"
grep -q "completed; cache in $cache" "$out" || fail "the second run did not complete the cache"
stopped=0
for r in 0 1 2; do
  grep -q "generate: SIGUSR1: stopped before shard" "$(rank_log "$run" "$job" 0 "$r" srun)" && stopped=$((stopped + 1))
done
((stopped >= 1)) || fail "no rank of the first run logged its stop between shards"
kept=$(cat "$(rank_log "$run" "$job" 1 0 srun)" "$(rank_log "$run" "$job" 1 1 srun)" "$(rank_log "$run" "$job" 1 2 srun)" |
       grep -c "is complete already (a previous run's), kept")
((kept >= 3)) || fail "the second run kept $kept complete shard(s), expected at least 3"
[[ -f $cache/index.json ]] || fail "no index.json: the cache is not complete"
shards=$(grep -c '"file"' "$cache/index.json")
((shards == 51)) || fail "index.json lists $shards shards, expected 51"

# A student trains from it with no teacher rank (every shard verified before training), on the
# builtin teacher and data set the job made in its run folder.
# shellcheck disable=SC2086  # the flags are lists
mpirun --allow-run-as-root -n 1 "$WD_BIN" train --run-dir "$CLUSTER_DIR/student" $CPU_JOB_ARGS $keys --train.steps 4 \
  --teacher.checkpoint "$run/cache/tiny-teacher" --data.path "$run/cache/tiny-data.h5" \
  --teacher.ranks 0 --data.teacher_cache "$cache" > "$CLUSTER_DIR/student.log" 2>&1 ||
  { tail -20 "$CLUSTER_DIR/student.log"; fail "train from the cache failed"; }
grep -q "every shard's checksum verified" "$CLUSTER_DIR/student.log" || fail "the train did not verify the cache"
pass "job $job: SIGUSR1 with shards in -> exit 75, requeued, $kept shard(s) kept, cache of $shards shards COMPLETED and trained from"
