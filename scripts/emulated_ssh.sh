#!/bin/sh
# The ssh that scripts/emulate_hosts.sh gives mpiexec (MPICH's or Open MPI's): run the command on an emulated host,
# in its network namespace with its own hostname and IPC namespace. mpiexec calls it as it calls
# ssh: options, the host, then the remote command, shell-quoted (so it is parsed again by sh -c).
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec ip netns exec "$host" unshare -ui sh -c "hostname $host; $*"
