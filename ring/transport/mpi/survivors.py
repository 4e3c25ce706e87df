"""After a death: the survivors of an MPI transport agree on who is gone, then make a communicator
of themselves alone (MPI's Comm_create_group, which only its members call: no fault-tolerance
extension is needed, only agreement on the members first).

The agreement runs in rounds over point-to-point messages on the old communicator. In each
round every survivor sends every rank it believes alive the set of ranks it believes gone, and
waits for theirs (or for their death). A round in which every set heard equals this rank's own
and no new death was seen ends it; otherwise the union is the next round's set. Every survivor
hears the same messages in a round, so they end in the same round with the same set. The sets
only grow, so the rounds end. For 4 ranks where rank 3 died and rank 1 has not noticed yet::

    round 0   rank 0 says {3}   rank 1 says {}    rank 2 says {3}    -> not all equal: union {3}
    round 1   rank 0 says {3}   rank 1 says {3}   rank 2 says {3}    -> agreed: survivors 0, 1, 2

A rank may die after another has heard its message of a round but before a third has: the first
ends that round and calls Comm_create_group with the dead rank among the members, which would
wait for it inside MPI for ever, while the third goes on to the next round. So the call runs in
a thread while this one watches for deaths among the members; on one, it is given up (MPI cannot
cancel it: it stays inside MPI, polling, for the rest of the process) and the agreement goes on
at the next round, where the third waits. The communicator then has the tag of the round that
agreed on it, so a call given up never meets the next.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ring.transport.base import TransportTimeout
from ring.transport.host_waits import GivenUp, pause, watched

_FIRST_ROUND_TAG = 1000   # round k's messages carry tag 1000 + k (the runtime's own tags are below 20)
_FIRST_GROUP_TAG = 2000   # the Comm_create_group after round k carries tag 2000 + k
_LOOK_SECONDS = 0.02      # between looks for deaths while a round waits
_kept: list = []          # sends to ranks that died before taking them, kept with their buffers for good


def survivors(transport, until: float) -> tuple[list[int], MPI.Intracomm]:
    """Every survivor of ``transport`` (an ``MPITransport``) together: the ranks they agree are
    gone (dead, or left with a farewell), sorted, and the communicator of the others in their old
    order. Raises TransportTimeout at ``until`` (a ``time.monotonic()`` value)."""
    gone, first_round = _seen_gone(transport.control), 0
    while True:
        gone, round_ = _agree(transport, gone, first_round, until)
        comm = _create_group(transport, gone, _FIRST_GROUP_TAG + round_, until)
        if comm is not None:
            return sorted(gone), comm
        gone |= _seen_gone(transport.control)
        first_round = round_ + 1


def _agree(transport, gone: set[int], first_round: int, until: float) -> tuple[set[int], int]:
    """The rounds from ``first_round`` on (see the module's docstring): the agreed set of the gone
    and the round that agreed on it."""
    control, me, n = transport.control, transport.rank, transport.size
    for round_ in range(first_round, first_round + n + 1):
        alive = [p for p in range(n) if p != me and p not in gone]
        mine = np.zeros(n, np.uint8)
        mine[sorted(gone)] = 1
        heard, newly_gone = _exchange(transport, alive, mine, _FIRST_ROUND_TAG + round_, until)
        newly_gone |= _seen_gone(control) - gone
        if not newly_gone and all(np.array_equal(theirs, mine) for theirs in heard.values()):
            return gone, round_
        for theirs in heard.values():
            gone |= set(np.flatnonzero(theirs).tolist())
        gone |= newly_gone
    return gone, round_   # (unreachable: each round but the last adds a rank)


def _create_group(transport, gone: set[int], tag: int, until: float) -> MPI.Intracomm | None:
    """MPI's Comm_create_group of every rank of ``transport`` but ``gone`` (only they call it), or
    None if one of them is found gone meanwhile (see the module's docstring)."""
    comm, control = transport.comm, transport.control
    outer = comm.Get_group()
    inner = outer.Excl(sorted(gone)) if gone else outer.Dup()
    outer.Free()
    started = time.monotonic()

    def give_up() -> str:
        return _LATE if time.monotonic() >= until else "a member is gone" if _seen_gone(control) - gone else ""

    try:
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            made = comm.Create_group(inner, tag)   # (no other thread may call MPI meanwhile: the gap above stays open)
        else:
            made = watched(lambda: comm.Create_group(inner, tag), _LOOK_SECONDS, give_up, "collectives survivors",
                           keep=inner)
    except GivenUp as e:
        if str(e) == _LATE:
            raise TransportTimeout(-1, time.monotonic() - started, "every survivor to make their communicator") from None
        return None
    except MPI.Exception:
        inner.Free()
        raise
    inner.Free()
    return made


_LATE = "the deadline passed"


def _seen_gone(control) -> set[int]:
    """The ranks this rank now knows to be gone: dead (here, or as a farewell said) or departed."""
    control.read()
    return set(control.dead) | set(control.dead_peers()) | set(control.departed)


def _exchange(transport, alive: list[int], mine: np.ndarray, tag: int, until: float) -> tuple[dict, set]:
    """Send ``mine`` to each of ``alive`` and receive theirs; a peer found gone meanwhile is left
    out of what was heard and returned among the newly gone."""
    comm, control = transport.comm, transport.control
    buffers = {p: np.empty_like(mine) for p in alive}
    receives = {p: comm.Irecv([buffers[p], MPI.BYTE], p, tag) for p in alive}
    sends = []
    for p in alive:
        if p in control.remote and control.liveness is not None and control.liveness.gone(control.names[p]):
            continue   # (never send to a dead process over UCX: see ring.transport.mpi.liveness.Liveness.gone)
        sends.append(comm.Isend([mine, MPI.BYTE], p, tag))
    heard, lost, started, looked = {}, set(), time.monotonic(), 0.0
    while receives:
        for p in [p for p, request in receives.items() if request.Test()]:
            heard[p] = buffers[p]
            del receives[p]
        now = time.monotonic()
        if receives and now - looked >= _LOOK_SECONDS:
            looked = now
            for p in _seen_gone(control) & receives.keys():
                receives.pop(p).Cancel()
                lost.add(p)
            if now >= until:
                _kept.append((list(receives.values()), sends, buffers, mine))
                raise TransportTimeout(-1, now - started, f"ranks {sorted(control.names[p] for p in receives)} "
                                                          "to agree on which ranks are gone")
        if receives:
            pause(now - started, 0.0)
    if not MPI.Request.Testall(sends):
        _kept.append((sends, mine))   # (small messages: taken at once by every live peer)
    return heard, lost
