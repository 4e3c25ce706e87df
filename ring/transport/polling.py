"""How a rank waits without blocking inside MPI: between two polls of a request, spin, then give
up the core, then nap (``pause``); and what it asks the host about its peers (``process_state``,
``usable_cores``)."""
from __future__ import annotations

import os
import time

SPIN_SECONDS = 50e-6       # poll flat out this long (latency), then yield the core between polls
_YIELD_SECONDS = 20e-3     # then yield between polls until the wait is this old, then nap
_NAP_SHARE = 0.01          # a nap is this share of the time waited so far (so it adds at most 1%) ...
_MAX_NAP = 10e-3           # ... and never longer than this


def pause(waited: float, spin_seconds: float, background: bool = False) -> None:
    """Between two polls of a wait that has lasted ``waited`` seconds: nothing while it is younger
    than ``spin_seconds`` (latency), then give up the core (more ranks than cores: the peer we wait
    for may need it), then, past _YIELD_SECONDS, nap for _NAP_SHARE of the time waited so far.
    ``background``: nap from the start (a thread of this process computes on the core)."""
    if background:
        time.sleep(min(waited * _NAP_SHARE, _MAX_NAP))
        return
    if waited < spin_seconds:
        return
    if waited < _YIELD_SECONDS:
        os.sched_yield()
    else:
        time.sleep(min(waited * _NAP_SHARE, _MAX_NAP))


def usable_cores(pids=()) -> int:
    """The cores this process and ``pids`` (the other ranks on its host) may run on, together: a
    launcher that binds each rank to a core of its own (Open MPI does by default) leaves each one
    core, yet none shares it."""
    try:
        cores = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1
    for pid in pids:
        try:
            cores |= os.sched_getaffinity(pid)
        except OSError:   # gone, or not ours to read: its cores are not counted
            pass
    return len(cores)


_HAVE_PROC = os.path.isdir("/proc/self")


def process_state(pid: int) -> str | None:
    """None while ``pid`` runs; else how it ended. A zombie (dead, not yet reaped) counts as ended."""
    try:
        if not _HAVE_PROC:
            os.kill(pid, 0)
            return None
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "has exited"
    except OSError:
        return None   # cannot tell (permissions): the deadline still applies
    return "has exited" if state in (b"Z", b"X") else None
