"""One collective call: its sequence number and deadline, the cross-rank check, and its errors.

Every public collective starts with :func:`begin` and is wrapped in :func:`collective`:

* Before data moves, the ranks compare signatures (``collectives.signature``) by
  recursive doubling (``ring.doubling``): on any difference every rank raises the
  same CollectiveUsageError, and nothing has been written. A usage error found on
  one rank only is shared the same way, so the other ranks raise too instead of
  waiting for it. ``COLLECTIVES_CHECK=0`` (or ``init(check=False)``) skips the
  check on the large-message path; the small-message path carries it for free.
* Every wait ends by the call's deadline (``timeout=`` or ``COLLECTIVES_TIMEOUT``),
  or when a rank the call needs has left (its farewell) or died on this host:
  CollectiveError names the collective, its sequence number and the rank at fault,
  or after a timeout which call every other rank is in. Any other exception inside
  a call (Ctrl-C's KeyboardInterrupt, MemoryError) cancels what the call had posted.
  After either, the runtime refuses further calls, since the ranks are no longer in step.
* Calls are serialized: one thread at a time per process. The calling thread's
  name is part of the cross-rank check, so two threads whose calls interleave in
  another order on another rank raise CollectiveUsageError instead of mixing data.
* Floating-point reductions follow IEEE rules (overflow gives inf) whatever
  ``np.seterr`` says, and print no warnings: the same on every rank.
"""
from __future__ import annotations

import functools
import threading
import time
from threading import get_ident, main_thread
from typing import Callable, NoReturn, TypeVar

from collectives import validate
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.signature import disagreement, signature as make_signature
from collectives import world as _worlds
from collectives.world import World, world
from ring import arrays, doubling
from ring.transport.base import TransportError, TransportTimeout

F = TypeVar("F", bound=Callable)
_PROBLEM_BYTES = 512
_MAIN_THREAD = main_thread().ident
_ROLL_CALL_GRACE = 1.0   # seconds the ranks that timed out spend finding out which others are here too


class Call:
    """The state of one call of one collective on this rank."""

    def __init__(self, w: World, name: str, timeout: object, call_name: object = None):
        self.world = w
        self.name = name
        self.call_name = call_name if isinstance(call_name, str) else ""   # (a bad one is a usage error)
        w.seq += 1
        self.seq = w.seq
        seconds = w.timeout if timeout is None or not validate.is_timeout(timeout) else timeout
        w.transport.deadline = time.monotonic() + seconds
        w.transport.seq = w.seq

    def signature(self, op: str = "", dtype=None, shape: tuple | None = None, root: int = -1,
                  memory: str = "") -> bytes:
        """This call's signature (see ``collectives.signature``): these fields plus the collective,
        the sequence number, the caller's ``name=``, and the calling thread's name ("" for the main
        thread, which costs single-threaded programs nothing)."""
        thread = "" if get_ident() == _MAIN_THREAD else threading.current_thread().name
        return make_signature(self.name, self.seq, op, dtype, shape, root, False, memory, self.call_name, thread)

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
        CollectiveUsageError as error: call.reject(error)``). With the check off the other ranks
        cannot be told: they go on waiting, so this rank stops the runtime (out of step)."""
        if self.world.check:
            signature = make_signature(self.name, self.seq, rejected=True)
            try:
                self.settle(doubling.agree(self.world.transport, signature), signature, str(error))
            except CollectiveUsageError:
                pass   # this rank raises its own, more precise error
        else:
            self.world.failure = (f"{self.name} #{self.seq} on rank {self.world.rank} was refused with "
                                  f"COLLECTIVES_CHECK=0, so the other ranks were not told: {error}")
        raise error


def begin(name: str, timeout: object = None, call_name: object = None) -> Call:
    """Start a call of collective ``name``: take the next sequence number, set the deadline.
    ``call_name`` is the caller's ``name=`` for it (checked by ``validate.call_name``).

    An invalid ``timeout`` is reported by ``collectives.validate.timeout`` inside the
    call, so that it is shared like any usage error; until then the default applies.
    """
    w = _worlds._world   # (set up by the call's frame, see collective)
    if w.failure is not None:
        raise CollectiveError(f"{name}: the runtime stopped after an earlier failure ({w.failure}); "
                              "the ranks are no longer in step, so end the job and restart it")
    return Call(w, name, timeout, call_name)


def collective(name: str) -> Callable[[F], F]:
    """Mark a public collective: one call at a time per process, IEEE floating point, and every
    way out of it accounted for. A transport failure becomes a CollectiveError that names the
    collective, its sequence number, this rank and the ranks at fault; it, and any exception
    that is not a usage error shared by every rank, stops the runtime on this rank."""
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            w = _worlds._world or world(setup_timeout=kwargs.get("timeout"))
            if w.threads_checked:
                _check_thread(w, name)
            w.lock.acquire()
            quiet = arrays.ieee_floating_point()
            try:
                result = fn(*args, **kwargs)
            except CollectiveUsageError:
                if w.failure is None:
                    w.completed = w.seq   # raised alike on every rank: still in step
                raise
            except TransportError as e:
                w.transport.abandon()
                raise _failure(w, name, e) from e
            except CollectiveError:
                raise
            except BaseException as e:
                w.transport.abandon()
                w.failure = f"{name} #{w.seq} on rank {w.rank} was interrupted by {_named(e)}"
                raise
            else:
                w.completed = w.seq
                return result
            finally:
                arrays.restore_floating_point(quiet)
                w.lock.release()
        return call
    return decorate


def _check_thread(w: World, name: str) -> None:
    """MPI was started without thread support (below MPI_THREAD_SERIALIZED): only its main thread may call."""
    from mpi4py import MPI
    if not MPI.Is_thread_main():
        levels = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED"}
        raise CollectiveUsageError(
            f"{name}: called from thread {threading.current_thread().name!r}, but MPI was started with "
            f"{levels.get(MPI.Query_thread(), 'too little thread support')}, so only the main thread may "
            "call it (let mpi4py start MPI with its default thread level, 'multiple')")


def _named(error: BaseException) -> str:
    text = str(error)
    return type(error).__name__ + (f": {text}" if text else "")


def _failure(w: World, name: str, error: TransportError) -> CollectiveError:
    where = f"{name} #{w.seq} on rank {w.rank}"
    detail = f"{error}; {_census(w)}" if isinstance(error, TransportTimeout) else str(error)
    w.failure = f"{where}: {detail}"
    w.failed_by_peer = True
    return CollectiveError(w.failure)


def _census(w: World) -> str:
    """After a timeout: which call every other rank is in, as far as they answer (see roll_call)."""
    heard = w.transport.roll_call(_ROLL_CALL_GRACE)
    here = [r for r, seq in sorted(heard.items()) if seq == w.seq]
    elsewhere = [f"{r} (#{seq})" for r, seq in sorted(heard.items()) if seq != w.seq]
    silent = [r for r in range(w.size) if r != w.rank and r not in heard]
    parts = []
    if silent:
        parts.append(f"rank(s) in no collective call (busy elsewhere, or gone): {', '.join(map(str, silent))}")
    if elsewhere:
        parts.append(f"rank(s) in another call: {', '.join(elsewhere)}")
    if here:
        parts.append(f"rank(s) waiting in this call too: {', '.join(map(str, here))}")
    return "; ".join(parts) or "every rank is in this call (the slowest came too late)"
