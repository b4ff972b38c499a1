#!/usr/bin/env bash
# Two nodes: two slurmd daemons on this host (node1, node2); the multi-node template starts
# 2 x 2 ranks with LAUNCHER (srun by default, or mpirun). The job must complete, and the rank
# placement the job logged must put ranks 0-1 (the teacher and a student) on node1 and ranks
# 2-3 on node2 (3 students: eval_samples must be a multiple of the global batch 6). Usage: test_two_nodes.sh WD_BIN [srun|mpirun]
source "$(dirname "$0")/lib.sh"
launcher=${2:-srun}
slurm_test "two_nodes${2:+_$2}" "$1"
cluster_start 2 2 || fail "the cluster did not start"

# Both "nodes" are one host with one host name, so Open MPI's shared-memory segments (named by
# host, job and local rank) of node1's and node2's ranks would collide: TCP between all ranks.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp
run=$CLUSTER_DIR/run
job=$(LAUNCHER=$launcher EXTRA_ARGS="--train.steps 30 --train.eval_samples 12" submit slurm/train-multinode.sbatch "$run" \
      --nodes=2 --ntasks-per-node=2 --gpus-per-node=2) || fail "sbatch failed"
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
state=$(job_field "$job" JobState)
[[ $state == COMPLETED ]] || fail "job $job ended $state (exit $(job_field "$job" ExitCode))"
[[ $(job_field "$job" NodeList) == "node[1-2]" ]] || fail "job ran on $(job_field "$job" NodeList)"

# The placement table world rank 0 logged: rank, role, host, local, slurm-node, procid, nodeid.
log=$(rank_log "$run" "$job" 0 0 "$launcher")
[[ -f $log ]] || fail "no rank 0 log at $log"
table=$(sed -n '/rank placement/,/^\[/p' "$log" | grep -E '^ +[0-9]+ ')
echo "$table"
expect=("0 teacher node1 0" "1 student node1 0" "2 student node2 1" "3 student node2 1")
for line in "${expect[@]}"; do
  read -r r role node nodeid <<<"$line"
  got=$(awk -v r="$r" '$1 == r { print $2, $5, $7 }' <<<"$table")
  [[ $got == "$role $node $nodeid" ]] || fail "rank $r logged '$got', expected '$role $node $nodeid'"
done
pass "job $job COMPLETED on node[1-2] with $launcher; ranks 0-1 on node1 (teacher first), 2-3 on node2"
