#!/usr/bin/env bash
# A private SLURM cluster on this machine for the tests: munged, slurmctld and one slurmd per
# node name, every file (config, key, sockets, state, spool, logs) in one temporary directory.
#
# Sourced by the test drivers:   source tests/slurm/cluster.sh
#                                cluster_start 2 4     # 2 nodes x 4 CPUs (and 4 fake GPUs) each
#                                sbatch ...            # SLURM_CONF points at the private cluster
#                                cluster_stop          # also run by the EXIT trap cluster_start sets
# Or by hand:                    bash tests/slurm/cluster.sh start [NODES] [CPUS]  (prints DIR)
#                                bash tests/slurm/cluster.sh stop DIR
#
# Needs root (slurmd runs jobs as their owner) and Debian's slurm-wlm and munge. Nothing outside
# the temporary directory is touched: munged gets its own key, socket and seed file there, and
# the daemons listen on free unprivileged ports.

# Where the cluster lives; set by cluster_start.
CLUSTER_DIR=${CLUSTER_DIR:-}

_cluster_log() { echo "cluster: $*" >&2; }

# A free TCP port at or above $1 (probes with ss; ports in use are skipped). Every state counts,
# not only listening: a port held by another process's connection (the ports tried here overlap
# the kernel's ephemeral range, so an mpirun's or a closing slurm connection's local port can be
# one; TIME_WAIT too) makes slurmctld's bind fail with "Address already in use" (CI, stop 33).
_cluster_free_port() {
  local port=$1
  while [[ -n $(ss -Htan "sport = :$port") ]]; do port=$((port + 1)); done
  echo "$port"
}

# Waits up to $1 seconds for the command after it to succeed.
_cluster_wait() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 0.5
  done
}

# Writes $CLUSTER_DIR/slurm.conf and gres.conf for $1 nodes of $2 CPUs and $2 GPUs each.
_cluster_write_config() {
  local nodes=$1 cpus=$2 d=$CLUSTER_DIR
  # Ports spread by process id so clusters of concurrent test runs do not collide.
  local base=$((20000 + ($$ * 7) % 30000))
  local ctld_port node_port
  ctld_port=$(_cluster_free_port "$base")
  node_port=$(_cluster_free_port $((ctld_port + 1)))
  local host
  host=$(hostname -s)
  cat >"$d/slurm.conf" <<EOF
# Private test cluster written by tests/slurm/cluster.sh; everything lives in $d.
ClusterName=wdtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
# Our own munged: its socket is in the temporary directory. A requeued job may start again
# only after cred_expire seconds (120 by default); 10 keeps the requeue test short.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket,cred_expire=10
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
# Per node: srun --mpi=pmix makes spmix_appdir_<job>.<step> there, the same name on every node.
TmpFS=$d/tmp/%n
# No cgroups (containers and CI machines rarely delegate them): track processes by parent.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd, so no sacct: finished jobs stay in slurmctld's memory for scontrol, and every
# end of a job (each requeue included) is appended to a text file.
JobCompType=jobcomp/filetxt
JobCompLoc=$d/log/jobcomp.txt
MinJobAge=3600
SchedulerType=sched/builtin
# A pass every 2 s (default 60): a requeued job starts as soon as it is eligible again.
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
JobRequeue=1
ReturnToService=2
KillWait=30
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
# The nodes claim more CPUs (and GPUs) than this machine has; slurmd believes slurm.conf.
SlurmdParameters=config_overrides
GresTypes=gpu
EOF
  local i nodelist=() port=$node_port
  for ((i = 1; i <= nodes; i++)); do
    # Each node's port probed on its own: node_port + 1 may be taken (an mpirun of a test running
    # beside this one listens on a random port), and slurmd then fails with "Address already in use".
    ((i == 1)) || port=$(_cluster_free_port $((port + 1)))
    echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus Gres=gpu:$cpus RealMemory=1000 State=UNKNOWN" >>"$d/slurm.conf"
    nodelist+=("node$i")
    # slurmd creates neither its spool directory nor the TmpFS.
    mkdir -p "$d/spool/node$i" "$d/tmp/node$i"
  done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$d/slurm.conf"
  # Fake GPUs: slurm drops GPUs without device files, so links to /dev/null stand in for them. They
  # are counted, allocated and exported as CUDA_VISIBLE_DEVICES like real ones.
  mkdir -p "$d/dev"
  for ((i = 0; i < cpus; i++)); do ln -s /dev/null "$d/dev/nvidia$i"; done
  echo "Name=gpu File=$d/dev/nvidia[0-$((cpus - 1))]" >"$d/gres.conf"
  CLUSTER_NODES=("${nodelist[@]}")
}

# Starts munged, slurmctld and $1 slurmd daemons (node1..nodeN, $2 CPUs each, default 4), waits
# until every node is idle, and exports SLURM_CONF. Sets an EXIT trap that stops the cluster.
cluster_start() {
  local nodes=${1:-1} cpus=${2:-4}
  if [[ $(id -u) -ne 0 ]]; then
    _cluster_log "needs root (slurmd and munged run as root here)"
    return 1
  fi
  for tool in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
    command -v "$tool" >/dev/null || { _cluster_log "$tool not found (apt-get install slurm-wlm munge)"; return 1; }
  done
  CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/wd-slurm.XXXXXX")
  chmod 700 "$CLUSTER_DIR"
  trap cluster_stop EXIT
  local d=$CLUSTER_DIR
  mkdir -p "$d"/{munge,state,spool,run,log,tmp}
  chmod 700 "$d/munge"
  _cluster_write_config "$nodes" "$cpus"
  export SLURM_CONF=$d/slurm.conf

  # munged: a key of our own, so the machine's /etc/munge is never needed nor changed.
  mungekey --create --keyfile="$d/munge/munge.key" 2>>"$d/log/munged.log" || return 1
  munged --force --socket="$d/munge/munge.socket" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/log/munged.log" \
    --seed-file="$d/munge/munged.seed" 2>>"$d/log/munged.log" || {
    _cluster_log "munged did not start:"; tail -5 "$d/log/munged.log" >&2; return 1; }
  _cluster_wait 10 test -S "$d/munge/munge.socket" || { _cluster_log "no munge socket"; return 1; }

  slurmctld -f "$SLURM_CONF" 2>>"$d/log/slurmctld.err" || {
    _cluster_log "slurmctld did not start:"; tail -5 "$d/log/slurmctld.log" "$d/log/slurmctld.err" >&2; return 1; }
  _cluster_wait 30 scontrol ping || { _cluster_log "slurmctld does not answer"; tail -20 "$d/log/slurmctld.log" >&2; return 1; }
  local n
  for n in "${CLUSTER_NODES[@]}"; do
    slurmd -f "$SLURM_CONF" -N "$n" 2>>"$d/log/slurmd-$n.err" || {
      _cluster_log "slurmd $n did not start:"; tail -5 "$d/log/slurmd-$n.log" "$d/log/slurmd-$n.err" >&2; return 1; }
  done
  if ! _cluster_wait 60 _cluster_all_idle "$nodes"; then
    _cluster_log "nodes not idle after 60 s:"; sinfo -N >&2; tail -20 "$d/log/slurmctld.log" >&2
    return 1
  fi
  _cluster_log "up in $d: ${#CLUSTER_NODES[@]} node(s) x $cpus CPUs ($(sinfo -h -o '%N %T' | tr '\n' ' '))"
}

# Whether any of the processes still runs (zombies, which nobody may reap here, do not count).
_cluster_any_alive() {
  local p state
  for p in "$@"; do
    state=$(ps -o stat= -p "$p" 2>/dev/null) || continue
    [[ $state == Z* ]] || return 0
  done
  return 1
}

_cluster_all_idle() {
  [[ $(sinfo -h -N -t idle -o '%N' | sort -u | wc -l) -eq $1 ]]
}

# Stops every daemon started by cluster_start (by the pid files in $CLUSTER_DIR), and the jobs
# still running, then removes the directory unless KEEP_CLUSTER is set (its logs help debugging).
cluster_stop() {
  local d=${1:-$CLUSTER_DIR}
  [[ -n $d && -d $d ]] || return 0
  export SLURM_CONF=$d/slurm.conf
  # Jobs first, while the daemons can still deliver the signals.
  timeout 10 scancel --full --signal=KILL --state=RUNNING >/dev/null 2>&1 || true
  local f p daemons=() stepds=()
  for f in "$d"/run/slurmd-*.pid "$d/run/slurmctld.pid" "$d/munge/munged.pid"; do
    [[ -f $f ]] && daemons+=("$(cat "$f")")
  done
  # slurmstepd processes (one per job step) outlive their job for a while and ignore SIGTERM;
  # they are ours if their environment names our directory (SLURM_CONF). The job is over.
  for p in $(pgrep -f "slurmstepd" || true); do
    if grep -qa "$d" "/proc/$p/environ" 2>/dev/null; then stepds+=("$p"); fi
  done
  if ((${#stepds[@]})); then kill -KILL "${stepds[@]}" 2>/dev/null || true; fi
  if ((${#daemons[@]})); then
    kill -TERM "${daemons[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)) && _cluster_any_alive "${daemons[@]}"; do sleep 0.2; done
    kill -KILL "${daemons[@]}" 2>/dev/null || true
  fi
  if [[ -n ${KEEP_CLUSTER:-} ]]; then
    _cluster_log "stopped; files kept in $d"
  else
    rm -rf "$d"
    _cluster_log "stopped and removed $d"
  fi
  if [[ $d == "$CLUSTER_DIR" ]]; then CLUSTER_DIR=""; fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  case ${1:-} in
    start)
      cluster_start "${2:-1}" "${3:-4}"
      trap - EXIT
      echo "$CLUSTER_DIR"
      echo "export SLURM_CONF=$SLURM_CONF   # then sbatch, squeue, scontrol ..." >&2
      ;;
    stop) cluster_stop "${2:?usage: cluster.sh stop DIR}" ;;
    *) echo "usage: cluster.sh start [NODES] [CPUS] | stop DIR" >&2; exit 2 ;;
  esac
fi
