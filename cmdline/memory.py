"""How much memory this host has for a program's ranks: what the bench and the trainer check their
sizes against before they allocate, so that too large a size is a usage error, not a MemoryError
(or the OOM killer) in the middle of a run."""
from __future__ import annotations

# How many ranks share this host's memory, as their launcher counts them (srun's too): the trainer asks here.
from collectives.process.launchers import ranks_on_this_host  # noqa: F401


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


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB, for messages.

    >>> gib(3 << 30)
    '3.0 GiB'
    """
    return f"{nbytes / 2**30:.1f} GiB"
