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
# Several processes often share one GPU (teacher and students, colocated runs): expandable
# segments let each process's caching allocator grow and give back memory without the
# fragmentation of fixed segments. LibTorch reads this in C++ as Python does.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# After any non-zero exit mpirun sleeps through its kill sequence (twice the grace) even when
# every rank has already left. When the ranks agreed on an error before training (a bad config
# or data set), world rank 0 writes the exit code to WD_LAUNCH_STATUS; once mpirun has no rank
# left on this node, the launcher stops it and returns that code at once.
status=$(mktemp "${TMPDIR:-/tmp}/wd-launch.XXXXXX")
trap 'rm -f "$status"' EXIT
export WD_LAUNCH_STATUS=$status
# mpirun runs in a session of its own, so that a signal reaches it exactly once: from the
# launcher, which passes on TERM, INT (a terminal's Ctrl-C), HUP and USR1 (requeue); mpirun
# passes them to the ranks (a second TERM would make mpirun kill them without their stop).
setsid mpirun "${flags[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x PYTORCH_CUDA_ALLOC_CONF -x WD_LAUNCH_STATUS "$@" &
pid=$!
for sig in TERM INT HUP USR1; do
  # shellcheck disable=SC2064  # $sig now, $pid when the signal comes
  trap "kill -$sig \"\$pid\" 2>/dev/null" "$sig"
done
while kill -0 "$pid" 2>/dev/null; do
  # Ranks that have exited stay zombies until mpirun reaps them after its sleep: count the rest.
  # (grep without -q reads all of ps's output: `ps | grep -q` under pipefail fails whenever grep
  # exits on its match before ps has written the rest.)
  if [[ -s $status && -z $(ps --ppid "$pid" -o stat= | grep -v '^Z' || true) ]]; then
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
    exit "$(cat "$status")"
  fi
  sleep 0.2 || true  # a signal to the whole group ends the sleep; the loop goes on
done
rc=0
wait "$pid" || rc=$?
exit "$rc"
