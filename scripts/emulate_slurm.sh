#!/bin/bash
# A Slurm cluster on one Linux machine (root): slurmctld in namespace slurmctl (169.254.200.1) and one
# slurmd per node slurmn1..slurmnN (169.254.200.11..), each in its own network namespace joined by a
# bridge in a switch namespace (slurmsw), with its own hostname, IPC and mount namespace (where a hosts
# file naming every node is bind-mounted on /etc/hosts, and the node's own directory on TmpFS). No munge
# (auth/none, cred/none), no cgroups (proctrack/linuxproc, task/none); Debian's slurm-wlm (22.05).
#
#   eval "$(scripts/emulate_slurm.sh up [NODES [CPUS]])"   # default 2 nodes of 2 CPUs; prints the export SLURM_CONF=... line
#   scripts/emulate_slurm.sh run -- srun -N2 -n4 --mpi=pmi2 python -m collectives   # from the controller's namespace
#   scripts/emulate_slurm.sh run -- salloc -N2 -n4 mpiexec -n 4 python -m collectives
#   scripts/emulate_slurm.sh down          # stops every daemon, removes namespaces and files (also a killed run's)
#
# `run` sets SLURM_CONF itself (every Slurm command needs it) and keeps the caller's environment and
# directory: srun passes the environment on to the tasks (--export=ALL), so activate the venv and set
# PYTHONPATH before `run`. Jobs run as root. The daemons' logs: $dir/ctld/slurmctld.log and
# $dir/slurmnI/slurmd.log, $dir being /tmp/emulated-slurm (EMULATED_SLURM_DIR). `up` takes about 1.3 s
# (the nodes idle about 1.2 s after the daemons start); a job, 0.5-2 s. A requeued job waits 10 s
# (squeue's reason: BeginTime; AuthInfo=cred_expire below, 120 s by default). EMULATED_SLURM_PREFIX
# and EMULATED_SLURM_SUBNET give a second cluster beside this one (other namespaces, addresses, directory).
#
# Why not `ip netns exec`: it remounts /sys, and slurmd then dies; each daemon is started with
# `nsenter --net=/run/netns/NAME unshare --uts --ipc --mount` instead. The nodes share one TmpFS path,
# which each node's mount namespace backs with its own directory (--mpi=pmix's spmix_appdir_UID_JOB.STEP
# there would otherwise be one directory for every node), and have their own SlurmdSpoolDir (%n): with
# one for all, --mpi=pmi2's step socket there (sock.pmi2.JOB.STEP) is one for all, and MPI_Init hangs.
# Each node has its own /dev/shm (a tmpfs that ends with the node): MPICH names its shared memory there
# after the PMI job name, "JOB.STEP" under srun (mpich_shm_<FNV hash>_<node>), which a killed job leaves
# behind, and Slurm's job ids start at 1 again with each `up`; in the machine's /dev/shm the job of the
# same id in a later cluster attached to that leftover and failed in MPI_Init (a leftover of another size:
# "MPIDI_POSIX_comm_bootstrap: Out of memory") whatever it ran, until the job ids passed the leftovers'.
set -euo pipefail
prefix="${EMULATED_SLURM_PREFIX:-slurm}"
subnet="${EMULATED_SLURM_SUBNET:-169.254.200}"
dir="${EMULATED_SLURM_DIR:-/tmp/emulated-${prefix}}"
ctl="${prefix}ctl"
# The namespaces each node has of its own besides the network (the mount one is needed: /etc/hosts).
unshare_flags="${EMULATED_SLURM_UNSHARE:---uts --ipc --mount}"
switch="${prefix}sw"

# enter NAMESPACE HOSTNAME DIR-ON-TMPFS|"" CMD...: CMD in the network namespace, with its own hostname,
# IPC and mount namespace, /etc/hosts naming every node; on a node (DIR given), DIR bind-mounted on TmpFS
# and a /dev/shm of its own. It execs: call it last, or in a subshell.
enter() {
    local ns=$1 name=$2 tmp=${3:-}
    shift 3
    exec nsenter --net="/run/netns/$ns" unshare $unshare_flags --propagation private sh -c '
        mount --bind "$1" /etc/hosts
        if [ -n "$3" ]; then mount --bind "$3" "$4"; mount -t tmpfs -o mode=1777 "shm-$2" /dev/shm; fi
        hostname "$2"; shift 4; exec "$@"' sh "$dir/hosts" "$name" "$tmp" "$dir/tmp" "$@"
}

down() {
    local namespaces pids ns
    namespaces=$(ip netns list | awk '{print $1}' | grep -E "^${prefix}(ctl|sw|n[0-9]+)$" || true)
    # The daemons first (SIGTERM: slurmd ends its steps), then whatever is left in the namespaces: a
    # killed run's daemons, steps and sruns.
    pids=$(cat "$dir"/*/*.pid 2>/dev/null || true)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 $pids 2>/dev/null || break
        sleep 0.1
    done
    for ns in $namespaces; do
        ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
        ip netns delete "$ns"
    done
    rm -rf "$dir"
}

install() {
    local packages=(slurm-wlm libpmix2 libpmix-dev)   # (slurm's mpi/pmix plugin loads libpmix.so: the -dev package's)
    [ "$(dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -c "ok installed")" = 3 ] && return
    { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" \
        || { DEBIAN_FRONTEND=noninteractive apt-get update \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"; }; } \
        > /tmp/emulate_slurm-apt.log 2>&1 || { echo "emulate_slurm: apt-get failed: /tmp/emulate_slurm-apt.log" >&2; exit 1; }
    # (Debian's packages enable systemd units; nothing here runs them, and no daemon is left running.)
}

config() {
    local nodes=$1 cpus=$2 i
    cat <<EOF
ClusterName=emulated
SlurmctldHost=${ctl}(${subnet}.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
# A requeued job waits out this lifetime of its old credentials before it starts again (default 120 s):
# released sooner, its batch script is refused ("Job credential revoked") and the job ends.
AuthInfo=cred_expire=10
# (and the scheduler looks for jobs whose time has come every 2 s instead of 60)
SchedulerParameters=sched_interval=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The nodes' CPUs are what this file says, not what the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
StateSaveLocation=$dir/ctld
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmctldLogFile=$dir/ctld/slurmctld.log
SlurmdSpoolDir=$dir/%n
SlurmdPidFile=$dir/%n/slurmd.pid
SlurmdLogFile=$dir/%n/slurmd.log
# (debug3: each PMI request a step's tasks send is logged, with its length: tests/test_slurm.py reads them)
SlurmdDebug=debug3
# One path, a directory of its own on each node (bind-mounted in the node's mount namespace).
TmpFS=$dir/tmp
EOF
    for i in $(seq 1 "$nodes"); do
        echo "NodeName=${prefix}n$i NodeAddr=${subnet}.$((10 + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=emulated Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

up() {
    local nodes=${1:-2} cpus=${2:-2} i node
    install
    down
    mkdir -p "$dir/ctld" "$dir/tmp"
    config "$nodes" "$cpus" > "$dir/slurm.conf"
    { echo "127.0.0.1 localhost"; echo "${subnet}.1 $ctl"
      for i in $(seq 1 "$nodes"); do echo "${subnet}.$((10 + i)) ${prefix}n$i"; done; } > "$dir/hosts"
    ip netns add "$switch"
    ip -n "$switch" link add br0 type bridge
    ip -n "$switch" link set br0 up
    for i in 0 $(seq 1 "$nodes"); do
        if [ "$i" = 0 ]; then node=$ctl; else node="${prefix}n$i"; mkdir -p "$dir/$node/tmp"; fi
        ip netns add "$node"
        ip -n "$switch" link add "v$i" type veth peer name eth0 netns "$node"
        ip -n "$switch" link set "v$i" master br0 up
        ip -n "$node" addr add "${subnet}.$([ "$i" = 0 ] && echo 1 || echo $((10 + i)))/24" dev eth0
        ip -n "$node" link set eth0 up
        ip -n "$node" link set lo up
    done
    export SLURM_CONF="$dir/slurm.conf"
    # setsid: the daemons outlive this script and a signal to its caller's process group.
    enter "$ctl" "$ctl" "" setsid slurmctld -D -c -i > "$dir/ctld/stdout" 2>&1 < /dev/null &
    for i in $(seq 1 "$nodes"); do
        node="${prefix}n$i"
        enter "$node" "$node" "$dir/$node/tmp" setsid slurmd -D -N "$node" > "$dir/$node/stdout" 2>&1 < /dev/null &
    done
    for _ in $(seq 1 150); do   # 30 s
        if [ "$(enter "$ctl" "$ctl" "" sinfo -h -N -o %T 2>/dev/null | grep -cx idle)" = "$nodes" ]; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return
        fi
        sleep 0.2
    done
    echo "emulate_slurm: the nodes are not idle after 30 s:" >&2
    (enter "$ctl" "$ctl" "" sinfo -N -l) >&2 || true
    tail -n 5 "$dir"/ctld/slurmctld.log "$dir"/*/slurmd.log "$dir"/*/stdout >&2 || true
    exit 1
}

run() {
    [ "${1:-}" = "--" ] && shift
    [ -e "$dir/slurm.conf" ] || { echo "emulate_slurm: no cluster (run: $0 up)" >&2; exit 1; }
    export SLURM_CONF="$dir/slurm.conf"
    enter "$ctl" "$ctl" "" "$@"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 up [NODES [CPUS]] | run -- COMMAND... | down" >&2; exit 2 ;;
esac
