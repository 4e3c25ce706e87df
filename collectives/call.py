"""One collective call: its sequence number and deadline, the cross-rank check, and its errors.

Every public collective starts with :func:`begin` and is wrapped in :func:`collective`:

* Before data moves, the ranks compare signatures (``collectives.signature``) by
  recursive doubling (``ring.doubling``): on any difference every rank raises the
  same CollectiveUsageError, and nothing has been written. A usage error found on
  one rank only is shared the same way, so the other ranks raise too instead of
  waiting for it. ``COLLECTIVES_CHECK=0`` (or ``init(check=False)``) skips the
  check on the large-message path; the small-message path carries it for free.
* Every wait ends by the call's deadline (``timeout=`` or ``COLLECTIVES_TIMEOUT``)
  or when a peer on this host dies: CollectiveError names the collective, its
  sequence number and the ranks never heard from. After that the runtime refuses
  further calls, since the ranks are no longer in step.
"""
from __future__ import annotations

import functools
import time
from typing import Callable, NoReturn, TypeVar

from collectives import validate
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.signature import disagreement, signature as make_signature
from collectives.world import World, world
from ring import doubling
from ring.transport.base import PeerLost, TransportError, TransportTimeout

F = TypeVar("F", bound=Callable)
_PROBLEM_BYTES = 512
_ROLL_CALL_GRACE = 1.0   # seconds the ranks that timed out spend finding out which others are here too


class Call:
    """The state of one call of one collective on this rank."""

    def __init__(self, w: World, name: str, timeout: object):
        self.world = w
        self.name = name
        w.seq += 1
        self.seq = w.seq
        seconds = w.timeout if timeout is None or not validate.is_timeout(timeout) else timeout
        w.transport.deadline = time.monotonic() + seconds

    def agree(self, signature: bytes) -> None:
        """Check that every rank makes this same call (unless the check is off); raise on every rank if not."""
        if self.world.check:
            self.settle(doubling.agree(self.world.transport, signature), signature)

    def settle(self, agreed: bool, signature: bytes, problem: str = "") -> None:
        """After an agreement round: return if it agreed, else raise the same error on every rank."""
        if agreed:
            return
        packed = signature.ljust(doubling.SIGNATURE_BYTES, b"\0")
        text = problem.encode()[:_PROBLEM_BYTES].ljust(_PROBLEM_BYTES, b"\0")
        every = self.world.transport.allgather_bytes(packed + text)
        signatures = [row[:doubling.SIGNATURE_BYTES] for row in every]
        problems = [row[doubling.SIGNATURE_BYTES:].rstrip(b"\0").decode(errors="replace") for row in every]
        for r, other in enumerate(problems):
            if other:
                raise CollectiveUsageError(f"{other} (on rank {r}; this call was abandoned on every rank)")
        raise CollectiveUsageError(disagreement(self.name, signatures))

    def reject(self, error: CollectiveUsageError) -> NoReturn:
        """Raise this rank's usage ``error``; with the check on, first share it so every rank raises
        instead of waiting for this one (every collective validates in ``try: ... except
        CollectiveUsageError as error: call.reject(error)``)."""
        if self.world.check:
            signature = make_signature(self.name, self.seq, rejected=True)
            try:
                self.settle(doubling.agree(self.world.transport, signature), signature, str(error))
            except CollectiveUsageError:
                pass   # this rank raises its own, more precise error
        raise error


def begin(name: str, timeout: object = None) -> Call:
    """Start a call of collective ``name``: take the next sequence number, set the deadline.

    An invalid ``timeout`` is reported by ``collectives.validate.timeout`` inside the
    call, so that it is shared like any usage error; until then the default applies.
    """
    w = world()
    if w.failure is not None:
        raise CollectiveError(f"{name}: the runtime stopped after an earlier failure ({w.failure}); "
                              "the ranks are no longer in step, so end the job and restart it")
    return Call(w, name, timeout)


def collective(name: str) -> Callable[[F], F]:
    """Mark a public collective: a transport failure inside it becomes a CollectiveError that
    names it, its sequence number, this rank and the ranks at fault, and stops the runtime."""
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except TransportError as e:
                raise _failure(name, e) from e
        return call
    return decorate


def _failure(name: str, error: TransportError) -> CollectiveError:
    w = world()
    where = f"{name} #{w.seq} on rank {w.rank}"
    if isinstance(error, TransportTimeout):
        present = set(w.transport.roll_call(w.seq, _ROLL_CALL_GRACE)) | {w.rank}
        missing = [r for r in range(w.size) if r not in present]
        detail = f"{error}; rank(s) that never arrived: {', '.join(map(str, missing)) or 'none (all came late)'}"
    elif isinstance(error, PeerLost):
        detail = f"{error}; every rank waiting on it fails the same way"
    else:
        detail = str(error)
    w.failure = f"{where}: {detail}"
    return CollectiveError(w.failure)
