"""One collective call: its frame (turn, deadline, errors), the cross-rank check, and its failure.

Every collective of a ``Group`` is :func:`issue`\\ d with its body (``collectives.ops.bodies``):

* Before data moves, the ranks compare signatures (``collectives.calls.signature``) by
  recursive doubling (``ring.doubling``): on any difference every rank raises the
  same CollectiveUsageError, and nothing has been written. A usage error found on
  one rank only is shared the same way, so the other ranks raise too instead of
  waiting for it. ``COLLECTIVES_CHECK=0`` (or ``init(check=False)``) skips the
  check on the large-message path; the small-message path carries it for free.
* Every wait ends by the call's deadline (``timeout=`` or ``COLLECTIVES_TIMEOUT``),
  or when a rank the call needs has left (its farewell) or died: CollectiveError
  names the collective, its sequence number and the rank at fault, or after a
  timeout which call every other rank is in. Any other exception inside a call
  (Ctrl-C's KeyboardInterrupt, MemoryError) cancels what the call had posted.
  After either, the runtime refuses further calls, since the ranks are no longer in step.
* Calls run one at a time per process, in the order they were issued, through the
  progress engine (``collectives.calls.progress``): blocking ones in the caller's thread,
  ``async_op=True`` ones in the background behind a ``Work``. The issuing thread's
  name is part of the cross-rank check, so two threads whose calls interleave in
  another order on another rank raise CollectiveUsageError instead of mixing data.
* Floating-point reductions follow IEEE rules (overflow gives inf) whatever
  ``np.seterr`` says, and print no warnings: the same on every rank.

What a call costs here is counted by ``scripts/call_budget.py``: the frame takes what it needs
once (the deadline, the issuing thread) and pays for the timeline, the options and the
floating-point guard only when they are in use.
"""
from __future__ import annotations

import functools
import threading
from threading import get_ident
from time import monotonic, perf_counter
from typing import Any, Callable, NoReturn

import numpy as np

from collectives.calls import interrupts, table, timeline, validate
from collectives.errors import CollectiveError, CollectiveUsageError, MembershipChanged
from collectives.calls.group_protocol import CallGroup
from collectives.calls.progress import MAIN_THREAD, Work, issuer_name, on_behalf
from collectives.calls.runtime import Runtime
from collectives.calls.signature import disagreement, signature as make_signature, template
from ring import arrays, cost, doubling
from ring.transport.base import ROLL_CALL_GRACE, Bound, TransportError, TransportTimeout, from_this_call

_PROBLEM_BYTES = 512
#: A call that comes this long after the start of the group's last call comes after a pause (``after_a_pause``).
PAUSE_SECONDS = 0.01
#: A lane's call whose look for a give-up would come within this of the start of its own last call
#: needs none (``no_look_until``).
BACK_TO_BACK_SECONDS = 0.0001
_REDUCTIONS = table.REDUCING   # (the floating-point guard)


class Call(Bound):
    """One call of collective ``name`` on ``group`` on this rank, and the bound of its waits (a
    ``ring.transport.base.Bound``, handed to every transport call it makes): its sequence number
    (the group's count of calls, the same on every member in step), its deadline (``until``),
    the runtime's stop, what it forces (``forced``: ``algorithm=``) and, once its body has chosen,
    what it runs (``algorithm``) and the bytes this rank brings (``nbytes``). A value of this
    call alone: its body fills in what it ran, the frame returns it with the result."""

    __slots__ = ("group", "runtime", "name", "call_name", "thread", "forced", "algorithm", "nbytes", "signed",
                 "template", "in_step", "after_a_pause", "no_look_until", "began")

    def __init__(self, group: CallGroup, name: str, timeout: object, call_name: object = None, forced: object = None,
                 thread: str = "", background: bool = False):
        self.group = group
        runtime = self.runtime = group.runtime
        self.name = name
        self.call_name = call_name if type(call_name) is str else ""   # (a bad one is a usage error)
        self.forced = forced if type(forced) is str else None        # (likewise)
        self.thread = thread   # the name of the thread that issued the call ("" for the main thread)
        self.algorithm = ""    # the algorithm it runs, once chosen
        self.nbytes = 0        # the bytes this rank brings (for the timeline)
        self.signed = False    # the body has made its signature (its arguments are checked)
        self.template = b""    # ... from this template, ``% seq``
        self.in_step = False   # it returned, or raised alike on every member (the group's ``completed``)
        last = group.last
        self.seq = group.next_call(self)
        self.window = runtime.settings.timeout if timeout is None or not validate.is_timeout(timeout) else timeout
        now = self.began = monotonic()
        self.until = now + self.window   # (moved on by every wait that completes: see Bound.progressed)
        #: Whether the group's last call began more than PAUSE_SECONDS ago (or there was none): the others'
        #: words may have queued up meanwhile (``Control.check_gave_up``'s drain). (Its start, not its last
        #: progress: that is lost where its window is infinite; a long call is followed by a drain.)
        self.after_a_pause = last is None or now - last.began > PAUSE_SECONDS
        self.no_look_until = 0.0   # (see renew)
        self.stop = runtime.stopped   # (set by runtime.stop: a wait in flight ends at its next look)
        self.background = background

    def renew(self) -> int:
        """Make this call the group's next of its kind, as a lane reuses it (``collectives.ops.express``):
        a new number (returned), a fresh deadline, not yet in step; ``no_look_until``, where the group's
        last call was this one, that call's start plus BACK_TO_BACK_SECONDS: a look for a new give-up
        after the message that comes before then would find none (``collectives.ops.express``: "One
        look fewer"), else 0."""
        last = self.group.last
        self.seq = seq = self.group.next_call(self)
        self.in_step = False
        now = monotonic()
        # (``last`` may be this call: its start is read before it moves)
        self.after_a_pause = now - last.began > PAUSE_SECONDS   # (as in __init__)
        self.no_look_until = last.began + BACK_TO_BACK_SECONDS if last is self else 0.0
        self.began, self.until = now, now + self.window
        return seq

    def lasted_long(self, now: float | None = None) -> bool:
        """Whether this call has lasted longer than PAUSE_SECONDS (by ``now``, or the clock): a rank
        stalled inside it (its own work, the system, a signal's handler) or long kept waiting. The
        look for a give-up at its end then reads every word that came meanwhile, as one after a
        pause does at its start: MPICH moves one arrived message per test, and the others' words
        may wait behind messages of a later call (a partner that completed this one and went on:
        the single test of a rank stalled before it forwarded the result, at n = 3, found the
        partner's next message and missed the give-up, and the call completed there alone)."""
        return (monotonic() if now is None else now) - self.began > PAUSE_SECONDS

    def signature(self, op: str = "", dtype=None, shape: tuple | None = None, root: int = -1,
                  memory: str = "", compression: str = "", reproducible: bool = False) -> bytes:
        """This call's signature (see ``collectives.calls.signature``): these fields plus the collective,
        the sequence number, the caller's ``name=``, the issuing thread's name ("" for the main
        thread), the algorithm it forces and (all-reduce) its wire ``compression`` and whether it
        is ``reproducible``. Made once the
        body has checked its arguments, before anything moves: from here on a usage error is no
        longer this rank's refusal (see _frame)."""
        self.signed = True
        self.template = template(self.name, op, dtype, shape, root, False, memory, self.call_name, self.thread,
                                 self.forced or "", compression, reproducible)
        return self.template % self.seq

    def agree(self, signature: bytes, always: bool = False) -> None:
        """Check that every rank makes this same call; raise on every rank if not. Skipped when the
        check is off (COLLECTIVES_CHECK=0), unless ``always`` (the exchange is the call's own work,
        or what follows blocks inside MPI and needs every rank known to be there)."""
        if always or self.runtime.settings.check:
            if not doubling.agree(self.group.transport, self, signature):
                self.disagree(signature)

    def interrupted(self, by: str = "KeyboardInterrupt") -> None:
        """Stop the runtime on this rank: this call was interrupted (Ctrl-C, or an error not the call's own)."""
        g = self.group
        self.runtime.stop(f"{self.name} #{self.seq} on {g.where()} was interrupted by {by}", group=g)

    def disagree(self, signature: bytes, problem: str = "") -> NoReturn:
        """After an agreement round that did not agree: raise the same error on every rank."""
        packed = signature.ljust(doubling.SIGNATURE_BYTES, b"\0")
        text = problem.encode()[:_PROBLEM_BYTES].ljust(_PROBLEM_BYTES, b"\0")
        g = self.group
        every = g.transport.allgather_bytes(packed + text, self)
        signatures = [row[:doubling.SIGNATURE_BYTES] for row in every]
        problems = [row[doubling.SIGNATURE_BYTES:].rstrip(b"\0").decode(errors="replace") for row in every]
        for r, other in enumerate(problems):
            if other:
                shared = CollectiveUsageError(f"{other} (on rank {g.ranks[r]}; this call was abandoned on "
                                              f"every rank{' of the ' + g.label if g.label else ''})")
                shared.origin = g.ranks[r]   # (see reject)
                raise shared
        raise CollectiveUsageError(disagreement(self.name, signatures, g.ranks, g.label))

    def reject(self, error: CollectiveUsageError) -> NoReturn:
        """Raise this rank's usage ``error``; with the check on, first share it so every rank raises
        instead of waiting for this one. The frame does so for every usage error a body raises
        before its signature (its arguments' checks: see :func:`_frame`). With the check off the other ranks
        cannot be told: they go on waiting, so this rank stops the runtime (out of step)."""
        self.signed = True   # (what follows is every rank's: not to be refused again)
        if self.runtime.settings.check:
            signature = make_signature(self.name, self.seq, rejected=True, name=str(error))   # (two ranks' different
            # problems then disagree, and every rank raises the first one's)
            try:
                if not doubling.agree(self.group.transport, self, signature):
                    self.disagree(signature, str(error))
            except CollectiveUsageError as shared:   # the first rank's problem, the one every rank raises:
                if getattr(shared, "origin", None) != self.group.ranks[self.group.rank()]:
                    raise shared from error
                # this rank's own: raised below as it is (the others add "(on rank r; ...)")
        else:
            self.runtime.stop(f"{self.name} #{self.seq} on {self.group.where()} was refused with "
                              f"COLLECTIVES_CHECK=0, so the other ranks were not told: {error}")
        raise error

    def check_options(self, timeout: object, call_name: object, algorithm: object) -> None:
        """The options every collective takes, when given: ``timeout=``, ``name=``, ``algorithm=``
        (one of the collective's algorithms in ``ring.cost.ALGORITHMS``, or "hierarchical" for an
        all-reduce on a group that spans hosts)."""
        validate.timeout(self.name, timeout)
        validate.call_name(self.name, call_name)
        if algorithm is not None:
            of = "allreduce" if self.name == "allreduce_many" else self.name
            known = cost.ALGORITHMS.get(of, ()) + (("hierarchical",) if of == "allreduce" else ())
            if algorithm not in known:
                validate.fail(self.name, "algorithm", f"expected None (the runtime's choice) or one of "
                                                      f"{', '.join(map(repr, known))}, got {algorithm!r}"
                              if known else f"{self.name} has no algorithm to choose, got {algorithm!r}")


def issue(g: CallGroup, name: str, body: Callable, args: tuple, async_op: object = False, timeout: object = None,
          call_name: object = None, algorithm: object = None) -> Any:
    """Run ``body(call, *args)``, collective ``name`` on group ``g``, through this rank's progress
    engine (``collectives.calls.progress``) in issue order: at once, or with ``async_op=True`` in the
    background behind a ``Work`` handle. One call at a time per process, IEEE floating point,
    and every way out of it accounted for (see :func:`_frame`)."""
    runtime = g.runtime
    if g.destroyed:
        raise CollectiveUsageError(f"{name}: group: {g.label} was destroyed (Group.destroy())")
    if runtime.threads_checked:
        _check_thread(name, runtime.threads_checked)
    main = get_ident() == MAIN_THREAD   # (a blocking call runs its frame in this thread: told, not looked up again)
    issuer = "" if main and not on_behalf else issuer_name()   # (the main thread's name without a call: every
    # blocking call passes here)
    if async_op is False:
        return runtime.engine.run_now(_frame, g, name, body, args, timeout, call_name, algorithm, issuer, False,
                                      main)[0]
    if async_op is not True:
        body = refusal(CollectiveUsageError(f"{name}: async_op: expected True or False, got {async_op!r}"))
        return runtime.engine.run_now(_frame, g, name, body, args, timeout, call_name, algorithm, issuer, False,
                                      main)[0]
    job = functools.partial(_frame, g, name, body, args, timeout, call_name, algorithm, issuer, True)
    return runtime.engine.submit(Work(name, job, runtime.engine), inline=_on_gpu(args))


def _frame(g: CallGroup, name: str, body: Callable, args: tuple, timeout: object, call_name: object, algorithm: object,
           issuer: str, detached: bool = False, main: bool | None = None) -> tuple[Any, Call]:
    """Run one call (the engine's turn is held, in whichever thread); return its result and the
    call itself (its sequence number, the algorithm it ran). ``detached``: an async call, which
    may run on the engine's thread (then its waits nap: see ``Bound.background``). ``main``: whether
    this thread is the main one (a blocking call's ``issue`` looked, in this thread; None: look here).

    Each body checks its arguments first, then makes its signature (``Call.signature``); a usage
    error raised before that (a bad argument, here or in ``check_options``) is this rank's
    refusal of the call, which every rank hears of and raises (``Call.reject``): the prologue of
    every collective, in this one place. A transport failure becomes a CollectiveError that names
    the collective, its sequence number, this rank and the ranks at fault; it, and any exception
    that is not a usage error shared by every rank, stops the runtime on this rank."""
    runtime = g.runtime
    if runtime.failure is not None:
        raise stopped(name, runtime)
    if main is None:   # (whether this thread is the main one, where a Ctrl-C that comes as the call ends is
        main = get_ident() == MAIN_THREAD   # held back: interrupts; a blocking call's issue says)
    call = Call(g, name, timeout, call_name, algorithm, issuer, detached and runtime.engine.in_background())
    quiet = arrays.ieee_floating_point() if name in _REDUCTIONS else None
    started = perf_counter() if timeline.current is not None else 0.0
    try:
        try:
            if timeout is not None or call_name is not None or algorithm is not None:
                call.check_options(timeout, call_name, algorithm)
            if call.after_a_pause and not g.destroyed:   # (a rank that gave this call up while this one was
                g.transport.control.check_gave_up(call.seq, True, name)   # away: fail before any message, at once)
            result = body(call, *args)
            if not g.destroyed:   # (a rank that gave this call up: this one fails it too)
                g.transport.control.check_gave_up(call.seq, call.lasted_long(), name)
            if main:
                interrupts.held.on = True
        except CollectiveUsageError as error:
            if call.signed:
                raise
            call.reject(error)   # (the arguments' checks: every rank hears of this rank's refusal, and raises)
    except BaseException as e:
        if main:
            interrupts.held.on = True
        ended(call, e)
    else:
        call.in_step = True
        return result, call
    finally:
        if quiet is not None:
            arrays.restore_floating_point(quiet)
        if started and timeline.current is not None:
            _record(call, started)
        if main:
            if interrupts.held.pending:   # (settle's rare case: a Ctrl-C came in the call's books)
                interrupts.settle(call.interrupted)
            interrupts.held.on = False


def ended(call: Call, error: BaseException) -> NoReturn:
    """Raise what ``error``, which ended ``call``, means for its caller (from the ``except`` that
    caught it): a usage error shared by every rank leaves the ranks in step; a transport failure
    becomes a CollectiveError naming the call and the ranks at fault; anything else (Ctrl-C's
    KeyboardInterrupt, MemoryError) cancels what the call had posted. All but the first stop the
    runtime on this rank."""
    g, runtime = call.group, call.runtime
    if isinstance(error, CollectiveUsageError):
        if runtime.failure is None:
            call.in_step = True   # (raised alike on every rank)
        raise error
    if isinstance(error, TransportError):
        g.transports.abandon()
        raise _failure(call, error) from error
    if not isinstance(error, CollectiveError):
        g.transports.abandon()
        call.interrupted(named(error))
    raise error


def stopped(name: str, runtime: Runtime) -> CollectiveError:
    """The error for call ``name`` once the runtime has stopped on this rank after a failure, or
    was replaced by a new world's (MembershipChanged)."""
    if runtime.retired is not None:
        return MembershipChanged(f"{name}: this group belongs to the world before it changed ({runtime.retired}); "
                                 "make groups again on the new world (collectives.elastic does it for the world)")
    return CollectiveError(f"{name}: the runtime stopped after an earlier failure ({runtime.failure}); "
                           "the ranks are no longer in step, so end the job and restart it")


def _record(call: Call, started: float) -> None:
    g = call.group
    args = {"seq": call.seq, "bytes": call.nbytes}
    if call.algorithm:
        args["algorithm"] = call.algorithm
    if call.call_name:
        args["name"] = call.call_name
    if g.label:
        args["group"] = g.label
    timeline.add(timeline.COLLECTIVES, f"{call.name} #{call.seq}", started, perf_counter(), args)


def refusal(error: CollectiveUsageError) -> Callable:
    """A stand-in body for a call that is wrong before it starts (a bad ``async_op``, an adapter's
    refusal: ``Group.refuse``): it raises
    ``error`` the way every collective raises a usage error, so every rank hears of it."""
    def refuse(call: Call, *args) -> NoReturn:
        call.reject(error)
    return refuse


def _on_gpu(args: tuple) -> bool:
    """Whether a call's array (first argument, or the first of a list) is a GPU (cupy) array."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    return first is not None and not isinstance(first, np.ndarray) and arrays.is_array(first)


def _check_thread(name: str, level: str) -> None:
    """MPI was started with thread ``level`` below MPI_THREAD_SERIALIZED: only its main thread may call."""
    if threading.current_thread() is not threading.main_thread():
        raise CollectiveUsageError(
            f"{name}: called from thread {threading.current_thread().name!r}, but MPI was started with "
            f"{level}, so only the main thread may call it (let mpi4py start MPI with its default thread "
            "level, 'multiple')")


def named(error: BaseException) -> str:
    """An exception as a failure names it: its type, and its text if any."""
    text = str(error)
    return type(error).__name__ + (f": {text}" if text else "")


def _failure(call: Call, error: TransportError) -> CollectiveError:
    g = call.group
    where = f"{call.name} #{call.seq} on {g.where()}"
    runtime = g.runtime
    if runtime.failure is not None:   # stopped from outside the call (runtime.stop: a wait ran out, Ctrl-C)
        return CollectiveError(f"{where} was stopped: {runtime.failure}")
    detail = str(error)
    if isinstance(error, TransportTimeout):
        census, absent, here = _census(g, call.seq, call.name)
        if error.peer in here and absent:   # (the rank this one waits for waits too: name those the call waits for)
            detail = error.words(error.waited, f"rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} "
                                               f"(here for a message from rank {error.peer}, which waits in this call too)")
        detail += f"; {census}"
    return CollectiveError(runtime.stop(f"{where}: {detail}", error, by_peer=True, patience=call.window, group=g))


def _census(g: CallGroup, seq: int, name: str) -> tuple[str, list[int], list[int]]:
    """After a timeout in call ``seq`` (collective ``name``): which call of this group every other
    member is in, as far as they answer (see ``Control.roll_call``), in words; the ranks the call
    waits for (unreachable, silent, ended, or in another call); those waiting in it too. Ranks are
    world ranks, call numbers count this group's calls."""
    control = g.transport.control
    heard = control.roll_call(seq)
    unreachable = [r for r in control.unreachable() if r not in heard]
    here = [r for r, answer in sorted(heard.items()) if from_this_call(answer, seq, name)]
    elsewhere = [f"{r} (#{s}{' ' + n if n else ''})" for r, (s, n) in sorted(heard.items()) if r not in here]
    me = g.ranks[g.rank()]
    silent = [r for r in g.ranks if r != me and r not in heard and r not in unreachable]
    # (a rank that said it left after completing this call, as it saw it, is not gone for it: where the
    # check is off, ranks that disagree about a call may each complete their own)
    done = {control.names[p] for p, (_, completed, _) in control.departed.items() if completed >= seq}
    ended = [r for r in silent if r in done]
    silent = [r for r in silent if r not in done]
    parts = []
    if unreachable:
        parts.append(f"rank(s) unreachable (their host did not acknowledge a message for {ROLL_CALL_GRACE:g} s: "
                     f"its link or the host is down): {', '.join(map(str, unreachable))}")
    if silent:   # (a rank answers on the channel of the group whose call it waits in)
        where = "in no collective call on this group" if not g.is_world else \
            "in no call on the world (maybe in a group's)" if g.runtime.grouped else "in no collective call"
        parts.append(f"rank(s) not answering ({where}, computing between two messages of this one, or gone): "
                     f"{', '.join(map(str, silent))}")
    if ended:
        parts.append(f"rank(s) that ended their program after completing this call as they saw it (is the "
                     f"cross-rank check off?): {', '.join(map(str, ended))}")
    if elsewhere:
        parts.append(f"rank(s) in another call: {', '.join(elsewhere)}")
    if here:
        parts.append(f"rank(s) waiting in this call too: {', '.join(map(str, here))}")
    absent = sorted(r for r in g.ranks if r != me and r not in here)
    return "; ".join(parts) or "every rank is in this call (the slowest came too late)", absent, here
