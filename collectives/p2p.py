"""Point-to-point messages between two ranks of a group: ``send``/``recv`` and their nonblocking forms.

For programs whose ranks do not all do the same thing (a parameter server and its workers):
host arrays move as raw bytes (no pickling) on the runtime's own communicator, under the
runtime's rules. Every wait is bounded by ``timeout=`` (default COLLECTIVES_TIMEOUT) and ends
early, with CollectiveError naming the rank, when a rank it expects has left (its farewell)
or any rank has died (its process gone); either stops the runtime, as a failed collective does.
A receive from ``source=None`` expects any rank of the group, so any departure ends it.

Every message carries its byte count, element count and dtype: a receive whose buffer has
another size or dtype raises CollectiveError naming both ranks and both, and writes nothing
into the buffer (see ``ring.transport.mpi.p2p``).

Point-to-point calls never wait for collectives: posting or waiting while async collectives
are queued or running (``w = allreduce(x, async_op=True); send(m, dest=1)``) goes ahead at
once, as in MPI, where messages and collectives are matched apart. (Where MPI was started
without MPI_THREAD_MULTIPLE there is no engine thread, so nothing runs beside them anyway.)

>>> if col.rank() == 0:                                         # doctest: +SKIP
...     col.send(np.arange(4.0), dest=1, tag=5)
... elif col.rank() == 1:
...     x = np.empty(4); col.recv(x, source=0, tag=5)
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from collectives.calls import validate
from collectives.process import startup
from collectives.calls.call import named, stopped
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.groups.group import Group, member
from ring.transport.base import MAX_P2P_TAG, Bound, PeerLost, TransportError, TransportTimeout


class Request:
    """A posted ``isend``/``irecv``; ``wait()`` returns the rank it came from (a receive) or went to."""

    __slots__ = ("_group", "_request", "_peer", "_what", "_done", "_source")

    def __init__(self, group: Group, request, peer: int | None, what: str):
        self._group, self._request, self._peer, self._what = group, request, peer, what
        self._done, self._source = False, -1

    def wait(self, timeout: float | None = None) -> int:
        """Block until done (at most ``timeout`` seconds); return the peer's rank in the group."""
        return wait_all([self], timeout)[0]


def send(x: np.ndarray, dest: int, tag: int = 0, *, group: Group | None = None, timeout: float | None = None) -> None:
    """Send host array ``x`` to rank ``dest`` of the group; returns once ``x`` may be reused."""
    _post("send", x, dest, tag, group, receive=False, setup_timeout=timeout).wait(timeout)


def recv(x: np.ndarray, source: int | None = None, tag: int = 0, *, group: Group | None = None,
         timeout: float | None = None) -> int:
    """Receive into host array ``x`` (exactly its size) from rank ``source`` (None: any rank) with
    ``tag``; return the rank it came from."""
    return _post("recv", x, source, tag, group, receive=True, setup_timeout=timeout).wait(timeout)


def isend(x: np.ndarray, dest: int, tag: int = 0, *, group: Group | None = None) -> Request:
    """Start sending ``x`` to rank ``dest``; do not touch ``x`` until the request is waited for."""
    return _post("isend", x, dest, tag, group, receive=False)


def irecv(x: np.ndarray, source: int | None = None, tag: int = 0, *, group: Group | None = None) -> Request:
    """Start receiving into ``x`` from rank ``source`` (None: any rank)."""
    return _post("irecv", x, source, tag, group, receive=True)


def wait_all(requests: list[Request], timeout: float | None = None) -> list[int]:
    """Wait for every request (of one group) within ``timeout`` seconds; return their peers' ranks."""
    pending = [r for r in requests if not r._done]
    if pending:
        g = pending[0]._group
        if any(r._group is not g for r in pending):
            raise CollectiveUsageError("wait_all: requests: all must belong to one group")
        validate.timeout("wait_all", timeout)
        sources = _in_turn(g, "wait", lambda: _wait(g, pending, timeout))
        for r, source in zip(pending, sources):
            r._done, r._source = True, source
    return [r._source for r in requests]


def _post(what: str, x: Any, peer: int | None, tag: int, group: object, receive: bool,
          setup_timeout: float | None = None) -> Request:
    world = startup.world(setup_timeout)   # (a blocking call's first: set up within its own timeout, as a collective's)
    g = member(group, what, world.runtime) if group is not None else world
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
        validate.fail(what, "x", "expected a contiguous numpy.ndarray (point-to-point moves host arrays)")
    if x.dtype.hasobject:
        validate.fail(what, "x", f"has dtype {x.dtype}, which holds Python objects; send their data instead")
    if receive:
        validate.writable(what, "x", x)
    if peer is not None or not receive:
        validate.rank(what, "source" if receive else "dest", peer, g.size(), g.is_world)
    validate.integer(what, "tag", tag)
    if not 0 <= tag <= MAX_P2P_TAG:
        validate.fail(what, "tag", f"expected 0..{MAX_P2P_TAG}, got {tag}")
    described = (f"{what} {'from' if receive else 'to'} "
                 f"{'any rank' if peer is None else f'rank {g.ranks[peer]}'} (tag {tag})")
    request = _in_turn(g, described, lambda: g.transport.p2p.post(x, peer, int(tag), receive))
    return Request(g, request, peer, described)


def _wait(g: Group, pending: list[Request], timeout: float | None) -> list[int]:
    runtime = g.runtime
    bound = Bound(None, time.monotonic() + (runtime.settings.timeout if timeout is None else timeout),
                  runtime.stopped)
    try:
        return g.transport.p2p.wait([r._request for r in pending], bound)
    except TransportError as e:
        raise _failed(g, _listed([r._what for r in pending]), e) from e


def _listed(whats: list[str], shown: int = 3) -> str:
    """The requests a failed wait names: each kind once, with its count, the first ``shown`` kinds.

    >>> _listed(["irecv from rank 3 (tag 3)", "isend to rank 1 (tag 0)", "irecv from rank 3 (tag 3)"])
    'irecv from rank 3 (tag 3) (2 requests), isend to rank 1 (tag 0)'
    """
    counts = dict.fromkeys(whats, 0)
    for what in whats:
        counts[what] += 1
    named = [what if n == 1 else f"{what} ({n} requests)" for what, n in counts.items()]
    return ", ".join(named[:shown]) + (", ..." if len(named) > shown else "")


def _failed(g: Group, what: str, error: TransportError) -> CollectiveError:
    """The error of point-to-point call(s) ``what`` that failed with ``error`` (posting one to a rank
    known dead, or waiting); the runtime stops, as after a collective's failure."""
    runtime = g.runtime
    if runtime.failure is not None:   # stopped meanwhile, by a collective's failure or a wait's timeout
        return CollectiveError(f"{what} on {g.where()} was stopped: {runtime.failure}")
    g.transports.abandon()
    return CollectiveError(runtime.stop(f"{what} on {g.where()}: {error}", error,
                                        by_peer=isinstance(error, (TransportTimeout, PeerLost))))


def _in_turn(g: Group, what: str, job):
    """Run ``job`` now, beside whatever collective runs (MPI_THREAD_MULTIPLE), or else in the engine's
    turn (MPI without threads: one call at a time); refused once the runtime has stopped."""
    runtime = g.runtime
    if runtime.failure is not None:
        raise stopped(what, runtime)

    def guarded():
        try:
            return job()
        except (CollectiveError, CollectiveUsageError):
            raise
        except TransportError as e:   # (a send to a rank on another host known dead: see MPITransport.sending_to)
            raise _failed(g, what, e) from e
        except BaseException as e:   # Ctrl-C while waiting: nothing posted may land later
            g.transports.abandon()
            runtime.stop(f"{what} on {g.where()} was interrupted by {named(e)}")
            raise
    return guarded() if runtime.engine.threaded else runtime.engine.run_now(guarded)
