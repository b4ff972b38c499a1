#!/usr/bin/env bash
# Prints the rank layout train will use (which world rank is teacher or student, on which node
# and GPU, serving which teacher replica) for a config and an allocation, before a queue slot
# is spent. Inside an allocation (salloc, or a batch job) the nodes and their names come from
# SLURM unless given. Needs only the built binary, no MPI, no GPU.
# Usage: bash launch/layout.sh [--config FILE] [--nodes N] [--gpus-per-node G] [--teacher.ranks T]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${WD_BIN:-${BUILD_DIR:-build}/src/app/wan-distill}
args=()
if [[ -n ${SLURM_JOB_NODELIST:-} && " $* " != *" --nodes "* ]]; then
  args+=(--nodes "$SLURM_JOB_NUM_NODES"
         --node-names "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)")
  if [[ -n ${SLURM_NTASKS_PER_NODE:-} && " $* " != *" --gpus-per-node "* ]]; then
    args+=(--gpus-per-node "${SLURM_NTASKS_PER_NODE%%(*}")
  fi
fi
exec "$bin" layout "${args[@]}" "$@"
