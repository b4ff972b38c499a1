#!/usr/bin/env bash
# The body the sbatch templates source: checks the allocation, prints the rank layout, starts one
# rank per GPU (srun --mpi=pmix, or mpirun), forwards SIGUSR1 to the ranks so they checkpoint
# and stop together, and requeues the job when they exit with the requeue code (75); the next
# run continues with --resume auto. Reads the variables the templates set (see slurm/*.sbatch).
# COMMAND=generate (slurm/generate.sbatch) runs `generate --output OUTPUT` instead: no teacher
# ranks or layout (every rank a whole teacher); on SIGUSR1 each rank stops between two shards,
# and the requeued run completes the cache, keeping the complete shards.
set -uo pipefail

COMMAND=${COMMAND:-train}
case $COMMAND in
  train) : "${TEACHER_RANKS:?} ${RUN_DIR:?} ${WD_BIN:?} ${LAUNCHER:?}" ;;
  generate) : "${OUTPUT:?generate needs OUTPUT, the cache folder} ${RUN_DIR:?} ${WD_BIN:?} ${LAUNCHER:?}" ;;
  *) echo "COMMAND must be train or generate, not '$COMMAND'" >&2; exit 2 ;;
esac
readonly requeue_code=75

nodes=${SLURM_JOB_NUM_NODES:?not inside a SLURM job (submit with sbatch)}
ranks=${SLURM_NTASKS:?sbatch needs --ntasks-per-node}
per_node=$((ranks / nodes))
run=${SLURM_RESTART_COUNT:-0}
log_dir=$RUN_DIR/logs/job-$SLURM_JOB_ID-run-$run
mkdir -p "$log_dir"
say() { echo "[$(date +%T)] wan-distill job $SLURM_JOB_ID: $*"; }

# One rank per GPU: a mismatch would leave GPUs idle or put two ranks on one GPU.
gpus=${SLURM_GPUS_PER_NODE:-}
gpus=${gpus##*:}  # "h100:8" -> "8"
if [[ -n $gpus && $gpus != "$per_node" ]]; then
  say "--ntasks-per-node ($per_node) must equal --gpus-per-node ($gpus): one rank per GPU"
  exit 2
fi
if ((ranks % nodes != 0)); then
  say "$ranks tasks do not split evenly over $nodes nodes"
  exit 2
fi

say "run $run on $SLURM_JOB_NODELIST: $nodes node(s) x $per_node rank(s), launcher $LAUNCHER, logs in $log_dir"
config_args=()
if [[ -n $CONFIG ]]; then config_args=(--config "$CONFIG"); fi
if [[ $COMMAND == train ]]; then
  # The layout the ranks will have; an invalid one (students not divisible by teacher replicas)
  # ends the job here, before any rank starts.
  "$WD_BIN" layout "${config_args[@]}" --teacher.ranks "$TEACHER_RANKS" --nodes "$nodes" \
    --gpus-per-node "$per_node" --node-names "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)" ||
    exit 2
  # Every run resumes from the newest good checkpoint (a first run starts fresh).
  # shellcheck disable=SC2206  # EXTRA_ARGS is a list of flags
  cmd=("$WD_BIN" train "${config_args[@]}" --teacher.ranks "$TEACHER_RANKS" --run-dir "$RUN_DIR"
         --resume auto ${EXTRA_ARGS:-})
else
  # Every run completes the cache: the shards a run before it completed are kept.
  # shellcheck disable=SC2206  # EXTRA_ARGS is a list of flags
  cmd=("$WD_BIN" generate "${config_args[@]}" --run-dir "$RUN_DIR" --output "$OUTPUT" ${EXTRA_ARGS:-})
fi

started=$log_dir/started
touch "$started"
case $LAUNCHER in
  srun)
    # Ranks in blocks, one log per rank. train picks the roles: each replica on its students'
    # node when every node holds whole replicas, else teachers (world ranks 0..T-1) first.
    # --kill-on-bad-exit: when a rank exits non-zero the others are stopped, after it has
    # printed the diagnosis (every rank runs the failure protocol before exiting).
    srun --mpi=pmix --kill-on-bad-exit=1 --distribution=block:block --ntasks-per-node="$per_node" \
      --output="$log_dir/rank-%t.log" --error="$log_dir/rank-%t.log" "${cmd[@]}" &
    ;;
  mpirun)
    # Under SLURM, mpirun learns the allocation from it and starts its daemons with srun.
    # Blocks of per_node ranks per node. WD_KILL_GRACE as in launch/mpirun.sh: when a rank
    # exits non-zero, the others get this long to finish the failure protocol before SIGKILL.
    # Open MPI 4.1 waits twice that after every non-zero exit (requeue included), even when
    # all ranks have already left (measured: 21 s at 10, 178 s at 90), so 30 here, not 90.
    flags=(--map-by "ppr:$per_node:node" --rank-by slot --bind-to none
           --mca odls_base_sigkill_timeout "${WD_KILL_GRACE:-30}" --output-filename "$log_dir:nocopy")
    if [[ $(id -u) -eq 0 ]]; then flags+=(--allow-run-as-root); fi
    mpirun "${flags[@]}" "${cmd[@]}" &
    ;;
  *)
    say "LAUNCHER must be srun or mpirun, not '$LAUNCHER'"
    exit 2
    ;;
esac
step=$!

# SIGUSR1 (--signal=B:USR1@T before the time limit, or scancel --signal=USR1 --batch) reaches
# this shell only; srun and mpirun both pass it on to every rank, which finish the same step,
# write a checkpoint and exit with 75.
forward_usr1() {
  say "SIGUSR1: asking the ranks to checkpoint and stop"
  kill -USR1 "$step" 2>/dev/null
}
trap forward_usr1 USR1

# `wait` returns early when a trapped signal arrives; wait again until the step has ended.
while :; do
  wait "$step"
  rc=$?
  kill -0 "$step" 2>/dev/null || break
done
# Once the ranks have stopped, a late SIGUSR1 (the time-limit signal after a manual one) must
# not kill this shell before it has requeued the job.
trap '' USR1

case $rc in
  0)
    if [[ $COMMAND == train ]]; then say "completed; student in $RUN_DIR/student"; else say "completed; cache in $OUTPUT"; fi
    ;;
  "$requeue_code")
    if [[ $COMMAND == train ]]; then
      say "ranks stopped with a checkpoint (exit $rc); requeueing, the next run resumes from it"
    else
      say "ranks stopped between shards (exit $rc); requeueing, the next run completes the cache"
    fi
    # The job goes back to the queue (same id, SLURM_RESTART_COUNT + 1); this shell is ended
    # by SLURM shortly after.
    if scontrol requeue "$SLURM_JOB_ID"; then
      sleep 60
    else
      say "the requeue was refused (--no-requeue, or JobRequeue=0 on this cluster); sbatch the" \
          "template again: the next run resumes from the checkpoint"
    fi
    ;;
  *)
    say "$([[ $COMMAND == train ]] && echo training || echo generate) stopped with exit code $rc (docs/failures.md)"
    if [[ -f $RUN_DIR/diagnosis.txt && $RUN_DIR/diagnosis.txt -nt $started ]]; then
      cat "$RUN_DIR/diagnosis.txt"
    fi
    say "per-rank logs: $log_dir"
    ;;
esac
exit "$rc"
