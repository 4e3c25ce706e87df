"""How a rank waits on its host, and what it asks the host: between two polls of a request, spin,
then give up the core, then nap (``pause``); how it makes a call that blocks inside MPI all the
same (``watched``); and what the host says of its peers and cores (``process_state``,
``siblings``, ``usable_cores``). The poll loop itself is ``ring.transport.mpi.waiting``."""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")

SPIN_SECONDS = 1e-3        # poll flat out this long (latency, and a large message's copies), then yield
# the core between polls. (MPICH moves a large message between ranks of one host in pieces, each as the
# two ranks poll: a rank that yields its core to another process mid-message stalls the transfer. Beside a
# nice-19 hog, a 1 MiB broadcast at n=2 took 290-760 us yielding after 50 us, 290-435 after 1 ms:
# docs/performance.md.)
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


class GivenUp(Exception):
    """A call made through ``watched`` was given up; the message is the reason."""


_given_up: list = []   # calls given up, with what they use: inside MPI for good (see watched)


def watched(call: Callable[[], T], every: float, give_up: Callable[[], str], name: str, keep: object = None) -> T:
    """Make ``call``, which blocks inside MPI where no deadline reaches (a spawn, Comm_create_group,
    a probe of a held MPI), in a thread named ``name``, asking ``give_up`` every ``every`` seconds
    while it runs; a reason (a non-empty string) gives the call up: GivenUp(reason). MPI cannot
    cancel a call, so its thread is kept, with ``keep`` (what it uses), for good. Returns what
    ``call`` returns, or raises what it raised.

    >>> watched(lambda: 6 * 7, every=0.01, give_up=lambda: "", name="example")
    42
    """
    outcome: dict = {}

    def make() -> None:
        try:
            outcome["result"] = call()
        except Exception as e:
            outcome["error"] = e

    calling = threading.Thread(target=make, name=name, daemon=True)
    calling.start()
    while True:
        calling.join(every)
        if not calling.is_alive():
            break
        why = give_up()
        if why and calling.is_alive():
            _given_up.append((calling, keep))
            raise GivenUp(why)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


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


def parent_of(pid: int) -> int | None:
    """The parent of process ``pid``, from Linux's /proc; None where it cannot tell.

    >>> parent_of(os.getpid()) == os.getppid()
    True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def siblings(pid: int | None = None) -> set[int]:
    """The other processes that the parent of process ``pid`` (None: this one) started and that still
    run (under MPICH's launcher: the other ranks on this host, or their supervisors), from Linux's
    /proc; none where it cannot tell.

    One that has ended but is not yet reaped (a zombie) has ended: hydra's proxy reaps a child only
    when an event wakes it (output, a closed descriptor, a PMI message) and then at most one, so a
    process whose end the proxy looked for too early stays a zombie for as long as the others keep
    quiet, in MPI_Finalize say (a finished job waited there for ever: CI, once; tests/test_elastic.py)."""
    pid, parent = (os.getpid(), os.getppid()) if pid is None else (pid, parent_of(pid))
    children = set()
    try:
        for task in os.listdir(f"/proc/{parent}/task"):   # (a child is listed under the thread that forked it)
            with open(f"/proc/{parent}/task/{task}/children") as f:
                children |= {int(child) for child in f.read().split()}
    except (OSError, ValueError):
        return set()
    return {child for child in children - {pid} if process_state(child) is None}
