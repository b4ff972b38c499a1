#!/usr/bin/env bash
# Two nodes, two teacher replicas: two slurmd daemons on this host (node1, node2), 2 x 2 ranks,
# teacher.ranks 2. Each replica (1 teacher + 1 student) fits a node, so train must put a teacher
# on each node: world ranks 0 and 2 teach, 1 and 3 learn, and every batch stays on its node.
# The job must complete, the rank placement world rank 0 logged must show that, and the
# `layout` the template printed must agree. Usage: test_two_nodes_replicas.sh WD_BIN
source "$(dirname "$0")/lib.sh"
slurm_test two_nodes_replicas "$1"
cluster_start 2 2 || fail "the cluster did not start"

# One host name for both "nodes": TCP between all ranks (test_two_nodes.sh says why).
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp
run=$CLUSTER_DIR/run
job=$(TEACHER_RANKS=2 EXTRA_ARGS="--train.steps 30 --train.eval_samples 8" submit slurm/train-multinode.sbatch "$run" \
      --nodes=2 --ntasks-per-node=2 --gpus-per-node=2) || fail "sbatch failed"
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
state=$(job_field "$job" JobState)
[[ $state == COMPLETED ]] || fail "job $job ended $state (exit $(job_field "$job" ExitCode))"

log=$(rank_log "$run" "$job" 0 0 srun)
[[ -f $log ]] || fail "no rank 0 log at $log"
table=$(sed -n '/rank placement/,/^\[/p' "$log" | grep -E '^ +[0-9]+ ')
echo "$table"
expect=("0 teacher node1" "1 student node1" "2 teacher node2" "3 student node2")
for line in "${expect[@]}"; do
  read -r r role node <<<"$line"
  got=$(awk -v r="$r" '$1 == r { print $2, $5 }' <<<"$table")
  [[ $got == "$role $node" ]] || fail "rank $r logged '$got', expected '$role $node'"
done
grep -q "each replica on one node" "$log" || fail "rank 0 did not log 'each replica on one node'"
grep -q "replica 1: teacher rank 2 on node2 streams to students 3 on node2 (within the node)" \
  "$CLUSTER_DIR/jobs/$job.out" || fail "the template's layout does not put replica 1 on node2"
pass "job $job COMPLETED; teachers at ranks 0 (node1) and 2 (node2), each streaming within its node"
