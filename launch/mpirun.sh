#!/usr/bin/env bash
# Local launcher: mpirun with the flags a workstation needs; everything else passes through.
# Usage: launch/mpirun.sh -np 3 build/src/app/wan-distill train [--config FILE] [--section.key v]
set -euo pipefail
flags=(--oversubscribe --bind-to none)
# When one rank fails, mpirun stops the others after this many seconds (Open MPI's default: 1):
# long enough here for them to finish the failure protocol, so one rank prints the diagnosis and
# every rank exits with the documented code. mpirun then returns only after twice this grace;
# to diagnose a rank that was killed outright, the grace must exceed comm.timeout_s + 15
# (docs/failures.md).
flags+=(--mca odls_base_sigkill_timeout "${WD_KILL_GRACE:-20}")
# Open MPI refuses root unless told; containers and CI machines often run as root.
if [[ $(id -u) -eq 0 ]]; then flags+=(--allow-run-as-root); fi
# One BLAS/OpenMP thread per rank: LibTorch's intra-op threads are set by the program itself
# (runtime.threads, default cores / ranks on the node), and nested BLAS threads oversubscribe.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec mpirun "${flags[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$@"
