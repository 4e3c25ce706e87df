"""The process's one world: MPI started lazily, a private communicator, the settings.

Settings (keyword arguments of :func:`init`, or environment variables):

``COLLECTIVES_SEGMENT_BYTES`` / ``segment_bytes``
    Largest message the ring sends, default 4 MiB. Bounds the receive scratch to two
    segments and sets how finely reduction overlaps transfer. Must be equal on every rank.
"""
from __future__ import annotations

import atexit
import os
import functools
from typing import Callable, TypeVar

import numpy as np

from collectives.errors import CollectiveError, CollectiveUsageError
from ring.transport.base import TransportError

DEFAULT_SEGMENT_BYTES = 4 << 20
F = TypeVar("F", bound=Callable)


class World:
    """Rank, size, the ring's transport and the settings, shared by every collective."""

    def __init__(self, transport, segment_bytes: int):
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.segment_bytes = segment_bytes

    def segment_elems(self, dtype: np.dtype) -> int:
        return max(1, self.segment_bytes // dtype.itemsize)


_world: World | None = None


def _segment_bytes_from_env() -> int:
    raw = os.environ.get("COLLECTIVES_SEGMENT_BYTES", str(DEFAULT_SEGMENT_BYTES))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise CollectiveUsageError(f"init: COLLECTIVES_SEGMENT_BYTES: expected a positive byte count, got {raw!r}")
    return value


def init(segment_bytes: int | None = None) -> None:
    """Start MPI (if needed) and this runtime; idempotent, and done lazily by the first collective.

    >>> import collectives as col
    >>> col.init(); col.init()          # the second call does nothing
    >>> 0 <= col.rank() < col.size()
    True
    """
    global _world
    if segment_bytes is not None and (isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int)
                                      or segment_bytes < 1):
        raise CollectiveUsageError(f"init: segment_bytes: expected a positive int, got {segment_bytes!r}")
    if _world is not None:
        if segment_bytes is not None:
            _world.segment_bytes = segment_bytes
        return
    chosen = segment_bytes if segment_bytes is not None else _segment_bytes_from_env()
    from mpi4py import MPI   # starts MPI on first import: only when asked for

    from ring.transport.mpi import MPITransport
    comm = MPI.COMM_WORLD.Dup()   # our messages never match the user's
    atexit.register(_free, comm)   # runs before mpi4py's own finalize (registered earlier)
    _world = World(MPITransport(comm), chosen)


def _free(comm) -> None:
    global _world
    _world = None
    try:
        comm.Free()
    except Exception:
        pass


def world() -> World:
    if _world is None:
        init()
    return _world


def rank() -> int:
    """This process's rank in the world, 0..size()-1."""
    return world().rank


def size() -> int:
    """The number of ranks in the world."""
    return world().size


def collective(name: str) -> Callable[[F], F]:
    """Mark a public collective: a transport failure inside it becomes a CollectiveError naming it and the rank."""
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except TransportError as e:
                where = f"rank {_world.rank}" if _world is not None else "rank ?"
                raise CollectiveError(f"{name} ({where}): {e}") from e
        return call
    return decorate
