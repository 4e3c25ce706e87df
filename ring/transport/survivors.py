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

(A rank that dies after another has heard its message of a round but before a third has is
the one gap: the first may end that round while the third goes on, and the first's
Comm_create_group then waits for the third inside MPI. Each round is a few milliseconds.)
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ring.transport.base import TransportTimeout
from ring.transport.polling import pause

_FIRST_ROUND_TAG = 1000   # round k's messages carry tag 1000 + k (the runtime's own tags are below 20)
_SURVIVORS_TAG = 12       # Comm_create_group's
_LOOK_SECONDS = 0.02      # between looks for deaths while a round waits
_kept: list = []          # sends to ranks that died before taking them, kept with their buffers for good


def agree_on_the_gone(transport, until: float) -> list[int]:
    """The ranks of ``transport`` (an ``MPITransport``) that every survivor agrees are gone (dead,
    or left with a farewell), sorted; every survivor calls it. Raises TransportTimeout at
    ``until`` (a ``time.monotonic()`` value)."""
    control, me, n = transport.control, transport.rank, transport.size
    gone = _seen_gone(control)
    for round_ in range(n + 1):
        alive = [p for p in range(n) if p != me and p not in gone]
        mine = np.zeros(n, np.uint8)
        mine[sorted(gone)] = 1
        heard, newly_gone = _exchange(transport, alive, mine, _FIRST_ROUND_TAG + round_, until)
        newly_gone |= _seen_gone(control) - gone
        if not newly_gone and all(np.array_equal(theirs, mine) for theirs in heard.values()):
            return sorted(gone)
        for theirs in heard.values():
            gone |= set(np.flatnonzero(theirs).tolist())
        gone |= newly_gone
    return sorted(gone)   # (unreachable: each round but the last adds a rank)


def survivors(transport, gone: list[int]) -> MPI.Intracomm:
    """The communicator of every rank of ``transport`` but ``gone``, in their order; only they call
    it (it blocks inside MPI until each has)."""
    outer = transport.comm.Get_group()
    inner = outer.Excl(gone) if gone else outer.Dup()
    try:
        return transport.comm.Create_group(inner, _SURVIVORS_TAG)
    finally:
        inner.Free()
        outer.Free()


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
            continue   # (never send to a dead process over UCX: see ring.transport.liveness.Liveness.gone)
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
