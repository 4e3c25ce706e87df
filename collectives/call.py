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
* Calls run one at a time per process, in the order they were issued, through the
  progress engine (``collectives.progress``): blocking ones in the caller's thread,
  ``async_op=True`` ones in the background behind a ``Work``. The issuing thread's
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

import numpy as np

from collectives import timeline, validate
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.signature import disagreement, signature as make_signature
from collectives import world as _worlds
from collectives.group import Group, NonMember
from collectives.progress import Work
from collectives.world import world
from ring import arrays, doubling
from ring.transport.base import TransportError, TransportTimeout

F = TypeVar("F", bound=Callable)
_PROBLEM_BYTES = 512
_MAIN_THREAD = main_thread().ident
_ROLL_CALL_GRACE = 1.0   # seconds the ranks that timed out spend finding out which others are here too


class Call:
    """The state of one call of one collective on this rank, on ``group``."""

    def __init__(self, group: Group, name: str, timeout: object, call_name: object = None):
        self.group = group
        runtime = self.runtime = group.runtime
        self.name = name
        self.call_name = call_name if isinstance(call_name, str) else ""   # (a bad one is a usage error)
        self.thread = _issuer   # the name of the thread that issued the call ("" for the main thread)
        self.nbytes = 0         # the bytes this rank brings (for the timeline)
        group.seq += 1
        self.seq = group.seq
        runtime.current = self
        seconds = runtime.timeout if timeout is None or not validate.is_timeout(timeout) else timeout
        deadline = time.monotonic() + seconds
        if runtime.failure is not None:   # stopped meanwhile (see progress.Engine.stop): fail at the first poll
            deadline = float("-inf")
        group.transport.deadline = deadline
        group.transport.seq = group.seq
        for level in group.levels or ():
            level.deadline = deadline

    def signature(self, op: str = "", dtype=None, shape: tuple | None = None, root: int = -1,
                  memory: str = "") -> bytes:
        """This call's signature (see ``collectives.signature``): these fields plus the collective,
        the sequence number, the caller's ``name=``, and the issuing thread's name ("" for the main
        thread, which costs single-threaded programs nothing)."""
        if dtype is not None and shape is not None and timeline.current is not None:
            self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return make_signature(self.name, self.seq, op, dtype, shape, root, False, memory, self.call_name,
                              self.thread)

    def agree(self, signature: bytes, always: bool = False) -> None:
        """Check that every rank makes this same call; raise on every rank if not. Skipped when the
        check is off (COLLECTIVES_CHECK=0), unless ``always`` (the exchange is the call's own work,
        or what follows blocks inside MPI and needs every rank known to be there)."""
        if always or self.runtime.check:
            self.settle(doubling.agree(self.group.transport, signature), signature)

    def settle(self, agreed: bool, signature: bytes, problem: str = "") -> None:
        """After an agreement round: return if it agreed, else raise the same error on every rank."""
        if agreed:
            return
        packed = signature.ljust(doubling.SIGNATURE_BYTES, b"\0")
        text = problem.encode()[:_PROBLEM_BYTES].ljust(_PROBLEM_BYTES, b"\0")
        every = self.group.transport.allgather_bytes(packed + text)
        signatures = [row[:doubling.SIGNATURE_BYTES] for row in every]
        problems = [row[doubling.SIGNATURE_BYTES:].rstrip(b"\0").decode(errors="replace") for row in every]
        for r, other in enumerate(problems):
            if other:
                raise CollectiveUsageError(f"{other} (on rank {self.group.ranks[r]}; this call was abandoned on "
                                           f"every rank{' of the ' + self.group.label if self.group.label else ''})")
        raise CollectiveUsageError(disagreement(self.name, signatures, self.group.ranks, self.group.label))

    def reject(self, error: CollectiveUsageError) -> NoReturn:
        """Raise this rank's usage ``error``; with the check on, first share it so every rank raises
        instead of waiting for this one (every collective validates in ``try: ... except
        CollectiveUsageError as error: call.reject(error)``). With the check off the other ranks
        cannot be told: they go on waiting, so this rank stops the runtime (out of step)."""
        if self.runtime.check:
            signature = make_signature(self.name, self.seq, rejected=True)
            try:
                self.settle(doubling.agree(self.group.transport, signature), signature, str(error))
            except CollectiveUsageError:
                pass   # this rank raises its own, more precise error
        else:
            self.runtime.failure = (f"{self.name} #{self.seq} on {self.group.where()} was refused with "
                                    f"COLLECTIVES_CHECK=0, so the other ranks were not told: {error}")
        raise error


def begin(name: str, group: Group | None = None, timeout: object = None, call_name: object = None) -> Call:
    """Start a call of collective ``name`` on ``group`` (None: the world): take the group's next
    sequence number, set the deadline. ``call_name`` is the caller's ``name=`` for it (checked
    by ``validate.call_name``).

    An invalid ``timeout`` is reported by ``collectives.validate.timeout`` inside the
    call, so that it is shared like any usage error; until then the default applies.
    """
    g = group if group is not None else _worlds._world   # (set up by the call's frame, see collective)
    refuse_if_stopped(name, g.runtime)
    return Call(g, name, timeout, call_name)


def refuse_if_stopped(name: str, runtime) -> None:
    """Raise CollectiveError for call ``name`` if the runtime has stopped on this rank after a failure."""
    if runtime.failure is not None:
        raise CollectiveError(f"{name}: the runtime stopped after an earlier failure ({runtime.failure}); "
                              "the ranks are no longer in step, so end the job and restart it")


def collective(name: str) -> Callable[[F], F]:
    """Mark a public collective: it runs through this rank's progress engine (``collectives.progress``)
    in issue order, at once or, with ``async_op=True``, in the background behind a ``Work`` handle;
    one call at a time per process, IEEE floating point, and every way out of it accounted for
    (see :func:`_frame`)."""
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            g = _worlds._world or world(setup_timeout=kwargs.get("timeout"))
            if kwargs.get("group") is not None:
                g = kwargs["group"] = _member_group(name, kwargs["group"])
            runtime = g.runtime
            if runtime.threads_checked:
                _check_thread(name)
            issuer = "" if get_ident() == _MAIN_THREAD else threading.current_thread().name
            async_op = kwargs.pop("async_op", False)
            if async_op is True:
                work = Work(name, functools.partial(_frame, g, name, fn, issuer, args, kwargs), runtime.engine)
                return runtime.engine.submit(work, inline=_on_gpu(args))
            body = fn if async_op is False else _refusal(name, CollectiveUsageError(
                f"{name}: async_op: expected True or False, got {async_op!r}"))
            return runtime.engine.run_now(_frame, g, name, body, issuer, args, kwargs)
        return call
    return decorate


_issuer = ""   # the issuing thread of the call being run (one runs at a time: see progress.Engine)


def _member_group(name: str, group: object) -> Group:
    """``group=``: a Group this rank belongs to; anything else is this rank's usage error (raised
    here alone: the members of a group it is not in are not waiting for it)."""
    if isinstance(group, NonMember):
        raise group.refusal(name)
    if not isinstance(group, Group):
        raise CollectiveUsageError(f"{name}: group: expected a collectives.Group (from new_group or split) "
                                   f"or None for the world, got {type(group).__name__}")
    if group.runtime is not _worlds._world.runtime:
        raise CollectiveUsageError(f"{name}: group: {group.label} belongs to another runtime")
    if group.destroyed:
        raise CollectiveUsageError(f"{name}: group: {group.label} was destroyed (Group.destroy())")
    return group


def _frame(g: Group, name: str, fn: Callable, issuer: str, args: tuple, kwargs: dict):
    """Run one call of collective ``name`` on group ``g`` (the engine's turn is held, in whichever
    thread).

    A transport failure becomes a CollectiveError that names the collective, its sequence
    number, this rank and the ranks at fault; it, and any exception that is not a usage
    error shared by every rank, stops the runtime on this rank."""
    global _issuer
    _issuer = issuer
    runtime = g.runtime
    quiet = arrays.ieee_floating_point()
    started = time.perf_counter() if timeline.current is not None else 0.0
    try:
        result = fn(*args, **kwargs)
    except CollectiveUsageError:
        if runtime.failure is None:
            g.completed = g.seq   # raised alike on every rank: still in step
        raise
    except TransportError as e:
        g.abandon()
        raise _failure(g, name, e) from e
    except CollectiveError:
        raise
    except BaseException as e:
        g.abandon()
        runtime.failure = runtime.failure or f"{name} #{g.seq} on {g.where()} was interrupted by {_named(e)}"
        raise
    else:
        g.completed = g.seq
        return result
    finally:
        arrays.restore_floating_point(quiet)
        if started and timeline.current is not None:
            _record(g, name, started)


def _record(g: Group, name: str, started: float) -> None:
    call = g.runtime.current
    args = {"seq": g.seq, "bytes": call.nbytes if call is not None else 0}
    if call is not None and call.call_name:
        args["name"] = call.call_name
    if g.label:
        args["group"] = g.label
    timeline.add(timeline.COLLECTIVES, f"{name} #{g.seq}", started, time.perf_counter(), args)


def _refusal(name: str, error: CollectiveUsageError) -> Callable:
    """A stand-in body for a call that is wrong before it starts (a bad ``async_op``): it raises
    ``error`` the way every collective raises a usage error, so every rank hears of it."""
    def refuse(*args, group: Group | None = None, timeout: object = None, name: object = None, **kwargs):
        begin(collective_name, group, timeout, name).reject(error)
    collective_name = name
    return refuse


def _on_gpu(args: tuple) -> bool:
    """Whether a call's array (first argument, or the first of a list) is a GPU (cupy) array."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    return first is not None and not isinstance(first, np.ndarray) and arrays.is_array(first)


def _check_thread(name: str) -> None:
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


def _failure(g: Group, name: str, error: TransportError) -> CollectiveError:
    where = f"{name} #{g.seq} on {g.where()}"
    runtime = g.runtime
    if runtime.failure is not None:   # stopped from outside the call (see progress.Engine.stop)
        return CollectiveError(f"{where} was stopped: {runtime.failure}")
    detail = f"{error}; {_census(g)}" if isinstance(error, TransportTimeout) else str(error)
    runtime.note_failure(f"{where}: {detail}", error, by_peer=True)
    return CollectiveError(runtime.failure)


def _census(g: Group) -> str:
    """After a timeout: which call of this group every other member is in, as far as they answer
    (see roll_call): ranks are world ranks, call numbers count this group's calls."""
    heard = g.transport.roll_call(_ROLL_CALL_GRACE)
    unreachable = [r for r in g.transport.unreachable() if r not in heard]
    here = [r for r, seq in sorted(heard.items()) if seq == g.seq]
    elsewhere = [f"{r} (#{seq})" for r, seq in sorted(heard.items()) if seq != g.seq]
    me = g.ranks[g.rank()]
    silent = [r for r in g.ranks if r != me and r not in heard and r not in unreachable]
    parts = []
    if unreachable:
        parts.append(f"rank(s) unreachable (their host did not acknowledge a message for {_ROLL_CALL_GRACE:g} s: "
                     f"its link or the host is down): {', '.join(map(str, unreachable))}")
    if silent:
        on = "" if g.is_world else " on this group"
        parts.append(f"rank(s) in no collective call{on} (busy elsewhere, or gone): {', '.join(map(str, silent))}")
    if elsewhere:
        parts.append(f"rank(s) in another call: {', '.join(elsewhere)}")
    if here:
        parts.append(f"rank(s) waiting in this call too: {', '.join(map(str, here))}")
    return "; ".join(parts) or "every rank is in this call (the slowest came too late)"
