#!/bin/bash
# Several hosts on one Linux machine (root): each host a network namespace with its own hostname and
# IPC namespace (so MPI cannot use shared memory between hosts), joined by a bridge in a switch
# namespace through veth pairs, addresses 169.254.100.<i>, /etc/netns/<host>/hosts naming every host.
#
#   scripts/emulate_hosts.sh up 3 [RATE]        # hosts ringh1..ringh3; RATE (tc tbf, e.g. 1gbit): each host link
#   scripts/emulate_hosts.sh shape 2 10mbit     # host 2's link from now on (none: unshaped)
#   scripts/emulate_hosts.sh run 2,2 -- python -m trainer     # mpiexec on ringh1, 2 ranks on each of 2 hosts
#   scripts/emulate_hosts.sh down               # remove every emulated host (also stale ones of a killed run)
#
# `run` launches with the venv's (or PATH's) mpiexec from host 1, MPICH's or Open MPI's, with
# scripts/emulated_ssh.sh as the ssh it starts the other hosts' proxies (MPICH) or daemons (Open MPI's
# prted) with; the environment (PYTHONPATH, MPIR_CVAR_*, OMPI_MCA_*, ...) travels. Consecutive ranks
# share a host under both (MPICH: the hostfile's order; Open MPI: --map-by slot over "slots=N").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${EMULATED_HOSTS_PREFIX:-ringh}"
switch="${prefix}sw"
hostfile=""

down() {
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}([0-9]+|sw)$" || true); do
        ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true   # (what a killed run left running there)
        ip netns delete "$ns"
    done
    rm -rf /etc/netns/"${prefix}"[0-9]*
}

up() {
    local hosts=$1 rate=${2:-}
    down
    ip netns add "$switch"
    ip -n "$switch" link add br0 type bridge
    ip -n "$switch" link set br0 up
    for i in $(seq 1 "$hosts"); do
        local host="${prefix}$i"
        ip netns add "$host"
        ip -n "$switch" link add "v$i" type veth peer name eth0 netns "$host"
        ip -n "$switch" link set "v$i" master br0 up
        ip -n "$host" addr add "169.254.100.$i/24" dev eth0
        ip -n "$host" link set eth0 up
        ip -n "$host" link set lo up
        [ -n "$rate" ] && shape "$i" "$rate"
        mkdir -p "/etc/netns/$host"
    done
    for i in $(seq 1 "$hosts"); do
        { echo "127.0.0.1 localhost"
          for j in $(seq 1 "$hosts"); do echo "169.254.100.$j ${prefix}$j"; done; } > "/etc/netns/${prefix}$i/hosts"
    done
}

shape() {   # host I's link: what it sends at RATE (tbf: no netem here), or as fast as it goes ("none")
    local host="${prefix}$1" rate=$2
    ip netns exec "$host" tc qdisc del dev eth0 root 2>/dev/null || true
    if [ "$rate" != none ]; then
        ip netns exec "$host" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    fi
}

run() {
    local layout=$1; shift
    [ "${1:-}" = "--" ] && shift
    local total=0 i=0 mpiexec open_mpi=""
    mpiexec="$(dirname "$(command -v python3)")/mpiexec"
    [ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec)"
    "$mpiexec" --version 2>/dev/null | grep -q "Open MPI" && open_mpi=1
    hostfile="$(mktemp /tmp/emulated-hosts.XXXXXX)"
    trap 'rm -f "$hostfile"' EXIT
    for slots in ${layout//,/ }; do
        i=$((i + 1)); total=$((total + slots))
        if [ -n "$open_mpi" ]; then echo "${prefix}$i slots=$slots"; else echo "${prefix}$i:$slots"; fi >> "$hostfile"
    done
    local launch
    if [ -n "$open_mpi" ]; then
        # prterun starts a prted on each other host through the agent; the agent runs it here, so it finds
        # prted on this PATH (the venv's bin first). --bind-to none: a host's ranks share 2 real cores.
        export PATH="$(dirname "$mpiexec"):$PATH"
        launch=("$mpiexec" --hostfile "$hostfile" --map-by slot --bind-to none
                --mca plm_rsh_agent "$here/emulated_ssh.sh")
        [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
    else
        launch=("$mpiexec" -f "$hostfile" -launcher ssh -launcher-exec "$here/emulated_ssh.sh")
    fi
    ip netns exec "${prefix}1" unshare -ui sh -c "hostname ${prefix}1; \"\$@\"" sh \
        "${launch[@]}" -n "$total" "$@"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    shape) shift; shape "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 up HOSTS [RATE] | shape HOST RATE|none | run SLOTS,SLOTS,... -- COMMAND... | down" >&2; exit 2 ;;
esac
