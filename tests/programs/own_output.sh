#!/bin/sh
# Run a command as this rank's process (exec: no shell left between it and the launcher) with its
# output in $OWN_OUTPUT.<rank>: kept even when the launcher exits before the rank does.
exec "$@" > "$OWN_OUTPUT.${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}" 2>&1
