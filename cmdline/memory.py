"""How much memory this host has for a program's ranks: what the bench and the trainer check their
sizes against before they allocate, so that too large a size is a usage error, not a MemoryError
(or the OOM killer) in the middle of a run."""
from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory available on this host (Linux's MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def ranks_on_this_host() -> int:
    """How many ranks the launcher started on this host (MPICH's and Open MPI's variables; 1 if neither)."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB, for messages.

    >>> gib(3 << 30)
    '3.0 GiB'
    """
    return f"{nbytes / 2**30:.1f} GiB"
