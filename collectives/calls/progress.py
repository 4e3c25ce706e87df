"""Nonblocking collectives: the ``Work`` handle, and the one engine that runs every call in issue order.

Every collective call is a job run by this rank's :class:`Engine`, one at a time, in the
order the calls were issued (which must be the same on every rank, as for blocking calls).
A blocking call waits for its turn and then runs in the caller's own thread: no thread hop,
so the latency path pays nothing for the engine. A call made with ``async_op=True`` returns
a :class:`Work` at once and is run by the engine's background thread, which keeps MPI
moving while the caller computes (numpy and BLAS release the GIL). One rank, two async
all-reduces, then a blocking barrier:

=========  =========================  ===================================
time       caller's thread            engine thread
=========  =========================  ===================================
t0         a = allreduce(g1, async)   runs a
t1         b = allreduce(g2, async)   (a still running: b is queued)
t2         computes backward          a done; runs b
t3         barrier(): waits its turn  b done
t4         runs the barrier itself    idle
t5         a.wait(), b.wait(): done
=========  =========================  ===================================

What is not threaded: calls on cupy arrays run in the caller's thread when their turn
comes (they only queue work on the caller's CUDA stream, as the blocking call does; their
``wait`` synchronizes that stream), and so does every call where MPI was started with less
than ``MPI_THREAD_MULTIPLE`` (the program's own MPI calls could then collide with the
engine's): there ``async_op=True`` runs the call at once and returns a completed handle.
"""
from __future__ import annotations

import threading
import warnings
from collections import deque
from threading import get_ident, main_thread
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable

from collectives.calls import timeline
from collectives.errors import CollectiveError, CollectiveUsageError, MembershipChanged
from collectives.calls.validate import bounded, is_timeout

if TYPE_CHECKING:   # (the runtime makes the engine: a real import would be a circle)
    from collectives.calls.runtime import Runtime

_allocate_lock = threading.Lock


class Work:
    """A collective issued with ``async_op=True``.

    ``wait()`` returns what the blocking call returns, or raises what it would raise;
    ``is_completed()`` never blocks. Once completed (without an error), ``seq`` is the call's
    sequence number on its group and ``algorithm`` the algorithm it ran (see
    ``collectives.algorithm_for``). Until ``wait`` returns, the call may still be reading and
    writing its arrays: do not touch them.

    >>> work = col.allreduce(grads, out=grads, async_op=True)   # doctest: +SKIP
    >>> loss = model.backward_rest()                            # doctest: +SKIP
    >>> work.wait()                                             # doctest: +SKIP

    A handle dropped without ``wait`` still runs in its turn and writes its result; later
    calls are unaffected. If it fails, the failure is not lost: one that stops the runtime
    makes every later call raise CollectiveError naming it, and a usage error (which leaves
    the ranks in step) is reported as a RuntimeWarning when the handle is garbage collected.
    """

    __slots__ = ("name", "seq", "algorithm", "issued_at", "started_at", "completed_at", "_job", "_engine", "_done",
                 "_result", "_error", "_waited", "_after", "_latch", "_callbacks", "__weakref__")

    def __init__(self, name: str, job: Callable[[], tuple[Any, Any]], engine: "Engine"):
        """``job()`` runs the call and returns its result and the call (its ``seq``, ``algorithm``:
        ``collectives.calls.call``)."""
        self.name = name
        self.seq: int | None = None           # its sequence number, once it has run
        self.algorithm = ""                   # the algorithm it ran ("" for calls that have none)
        self.issued_at = perf_counter()       # perf_counter seconds: issued, started, completed
        self.started_at: float | None = None
        self.completed_at: float | None = None
        self._job = job
        self._engine = engine
        self._done = False
        self._latch = _allocate_lock()   # held until the call is done (lighter than an Event: no Condition)
        self._latch.acquire()
        self._result: Any = None
        self._error: BaseException | None = None
        self._waited = False
        self._after: Callable[[], None] | None = None   # what wait() must still do (a GPU stream's sync)
        self._callbacks: list | None = []   # add_done_callback's, until the call is done (then None)

    def is_completed(self) -> bool:
        """Whether the call has finished on this rank (then ``wait`` returns at once)."""
        return self._done

    def add_done_callback(self, callback: Callable[["Work"], None]) -> None:
        """Call ``callback(work)`` once the call is done (at once, here, if it is), else in the thread
        that finished it, holding its turn: a call it issues runs at once there, right after this one
        on every rank, but it must not wait for a later one (such a wait raises CollectiveUsageError at
        once). What it raises becomes a RuntimeWarning."""
        registrant = issuer_name()
        with _CALLBACKS:
            if self._callbacks is not None:
                self._callbacks.append((callback, registrant))
                return
        _call_back(callback, self, registrant)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the call has finished; return its result, or raise its error.

        ``timeout`` (seconds) bounds this wait: if the call has not finished by then, the
        runtime stops as after a call's own timeout (what is in flight is abandoned, and
        this and every later call raise CollectiveError), since the ranks are no longer
        known to be in step. Ctrl-C while waiting does the same and raises KeyboardInterrupt.
        """
        if timeout is not None and not is_timeout(timeout):
            raise CollectiveUsageError(f"wait: timeout: expected a positive number of seconds or None, "
                                       f"got {timeout!r}")
        if not self._done and self._engine.turn.get(OWNER) == get_ident():   # (it would wait for ever, a bound too)
            raise CollectiveUsageError(f"wait: this {self.name} can run only once the done-callback waiting for it "
                                       "returns (the callback holds the turn of the call it follows, and this one was "
                                       "issued after that): wait for it after the callback")
        waiting = perf_counter()
        if not self._done and bounded(timeout) is None:   # (a bounded wait leaves the call to the engine
            self._engine.help(self)   # thread, so it can stop at the bound) still queued: run it here
        try:
            if not self._done and not self._finished_within(bounded(timeout)):
                self._engine.runtime.stop(f"rank {self._engine.world_rank()}: wait(timeout={timeout}) for an async "
                                          f"{self.name} ran out before the call finished")
                self._finished_within(None)
        except KeyboardInterrupt:
            self._engine.runtime.stop(f"rank {self._engine.world_rank()}: interrupted by KeyboardInterrupt while "
                                      f"waiting for an async {self.name}")
            raise
        self._waited = True
        if self._after is not None:
            self._after()
        if timeline.current is not None:
            timeline.add(timeline.PROGRAM, f"wait {self.name} #{self.seq}", waiting, perf_counter())
        if self._error is not None:
            retired = self._engine.runtime.retired
            if retired is not None and isinstance(self._error, CollectiveError) \
                    and not isinstance(self._error, MembershipChanged):
                raise MembershipChanged(f"wait: this {self.name} was in flight when the world changed ({retired}); "
                                        "it did not complete") from self._error
            raise self._error
        return self._result

    def _finished_within(self, timeout: float | None) -> bool:
        """Block until the call is done or ``timeout`` seconds (None: no bound) have passed."""
        if not self._latch.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._latch.release()   # (open for any other thread waiting on this handle)
        return True

    def _run(self) -> None:
        """Run the call (the engine's turn is held); keep its result or error; never raise."""
        self.started_at = perf_counter()
        try:
            self._result, call = self._job()
            self.seq, self.algorithm = call.seq, call.algorithm
        except BaseException as error:
            self._error = error
        self.completed_at = perf_counter()
        self._job = None   # (let go of the arguments)
        if self.started_at - self.issued_at > 1e-6 and timeline.current is not None:
            timeline.add(timeline.QUEUE, f"{self.name}{_numbered(self.seq)} queued", self.issued_at, self.started_at)
        self._done = True
        self._latch.release()
        with _CALLBACKS:
            callbacks, self._callbacks = self._callbacks, None
        for callback, registrant in callbacks:
            _call_back(callback, self, registrant)

    def __repr__(self) -> str:
        if self.is_completed():
            return f"<Work {self.name}{_numbered(self.seq)}, {'failed' if self._error else 'completed'}>"
        return f"<Work {self.name}, {'running' if self.started_at is not None else 'queued'}>"

    def __del__(self) -> None:
        if not self._waited and isinstance(self._error, CollectiveUsageError):
            warnings.warn(f"the handle of {self.name} was dropped without wait(), and its call raised: "
                          f"{self._error}", RuntimeWarning, stacklevel=2)


def _numbered(seq: int | None) -> str:
    """`` #seq`` where the call has its number, else nothing (it failed before or while running)."""
    return "" if seq is None else f" #{seq}"


_CALLBACKS = threading.Lock()   # (add_done_callback against the call finishing: rare, so one lock for all)


MAIN_THREAD = main_thread().ident   # (the thread whose calls are signed with "")
OWNER = "owner"   # (Engine.turn's one key)
#: The threads running a done-callback now: thread ident -> the name of the thread that registered
#: it, which the calls the callback issues are signed with (see issuer_name).
on_behalf: dict[int, str] = {}


def issuer_name() -> str:
    """The name a call issued here now is signed with (``collectives.calls.signature``): "" for the
    main thread, else the thread's name; inside a done-callback, the name of the thread that
    registered it, since the thread that runs a callback (the one that finished the call, or the
    registrant, where it was done already) differs from rank to rank, and its calls do not.

    >>> issuer_name()
    ''
    """
    ident = get_ident()
    behalf = on_behalf.get(ident) if on_behalf else None
    if behalf is not None:
        return behalf
    return "" if ident == MAIN_THREAD else threading.current_thread().name


def _call_back(callback: Callable[[Work], None], work: Work, registrant: str) -> None:
    ident = get_ident()
    outer = on_behalf.get(ident)   # (a callback that issues a call whose callback runs at once, here)
    on_behalf[ident] = registrant
    try:
        callback(work)
    except Exception as error:   # noqa: BLE001 - a callback's failure must not become the call's
        warnings.warn(f"a done-callback of {work.name}{_numbered(work.seq)} raised {type(error).__name__}: {error}",
                      RuntimeWarning, stacklevel=2)
    finally:
        if outer is None:
            del on_behalf[ident]
        else:
            on_behalf[ident] = outer


#: The engine thread takes a queued call once it is _PICKUP_SECONDS old: until then its caller may
#: take it (a handle waited at once, or a blocking call behind it: Engine.help), so that such calls
#: pay no thread hand-off (waking a thread and passing it the GIL cost more than a small call:
#: scripts/async_overhead.py). While async calls keep coming (one in the last _ACTIVE_SECONDS) the
#: thread is not woken by each, it looks every _PICKUP_SECONDS. A call left queued while its
#: caller computes starts within about 2 x _PICKUP_SECONDS.
_ACTIVE_SECONDS = 0.05
_PICKUP_SECONDS = 200e-6


class Engine:
    """Runs one process's calls, on every group, one at a time in issue order (see the module docstring).

    ``threaded``: async calls run on a background thread (MPI_THREAD_MULTIPLE); else at once.
    """

    def __init__(self, runtime: Runtime, threaded: bool):
        self.runtime = runtime
        self.threaded = threaded
        self._lock = threading.Lock()
        self._turns = threading.Condition(self._lock)   # waited on only when a call must wait its turn
        self._queue: deque[Work] = deque()   # issued, not yet started; a place with no job is a blocking
                                             # call's, which its caller runs itself (see _wait_for_turn)
        #: The turn: ``{OWNER: ident}`` while the call of that thread runs, else empty. A thread takes it
        #: by ``setdefault`` (:meth:`take`: one C call, atomic under the GIL, so the express lane takes
        #: it without the lock; a lock's acquire and release cost an 8-byte call about 0.4 us more,
        #: docs/performance.md), which also says whose it is: a Ctrl-C right after the take finds it
        #: handed back by the ``finally`` around it (:meth:`end_turn`, only by the thread that holds it).
        self.turn: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self._asleep = False                 # the engine thread waits for a submit's notify
        self._last_submit = float("-inf")

    def run_now(self, job: Callable[..., Any], *args) -> Any:
        """A blocking call: wait for the calls issued before it, then run ``job(*args)`` here. With no
        call queued and the turn free, it takes the turn at once, as an express lane does (:meth:`take`
        without the lock); else under the lock, where it runs or waits for the calls before it."""
        me, turn = threading.get_ident(), self.turn
        if turn.get(OWNER) == me:   # (a done-callback's: add_done_callback)
            return job(*args)
        try:   # (the turn is taken inside: see ``turn``)
            if self._queue or turn.setdefault(OWNER, me) != me:   # (take's, inline)
                with self._lock:
                    while self._queue and self._queue[0]._job is not None and self.take():
                        self._run_head_locked()   # async calls issued before this one, not yet taken: run them here
                    if self._queue or not self.take():
                        self._wait_for_turn()
            return job(*args)
        finally:
            if turn.get(OWNER) == me:   # end_turn's, inline (every blocking call ends here: a call fewer)
                turn.clear()
                if self._queue or self._closing:
                    with self._lock:
                        self._turns.notify_all()

    def idle(self) -> bool:
        """Whether no call holds the turn or waits for it: the express lane's way in takes it then,
        without the lock (:meth:`take`, inside the ``try`` whose ``finally`` is :meth:`end_turn`);
        else :meth:`run_now`'s, which waits."""
        return not self.turn and not self._queue

    def take(self) -> bool:
        """Take the turn for this thread if no call holds it (with the lock or without it: ``turn``).
        The caller does not hold it already (``run_now``'s first line), and calls it inside a ``try``
        whose ``finally`` is :meth:`end_turn`. (A call that waits for the turn has its place queued:
        one that took it without the lock meanwhile tells it when it ends.)"""
        me = threading.get_ident()
        return self.turn.setdefault(OWNER, me) == me

    def end_turn(self) -> None:
        """Hand the turn back, if this thread holds it. It takes no lock unless someone waits: a
        thread that waits for the turn queues its place (or sets _closing) under the lock before it
        looks for the turn, and waits under that lock if the turn is taken, so either it is seen
        here and notified under the lock, or it finds the turn free when it looks."""
        if self.turn.get(OWNER) != threading.get_ident():
            return
        self.turn.clear()
        if self._queue or self._closing:
            with self._lock:
                self._turns.notify_all()

    def _wait_for_turn(self) -> None:
        """(Holding the lock) queue a place for the caller and wait until it is at the head; async
        calls queued before it that no thread runs yet, the caller runs itself meanwhile (the
        engine thread would need a wake-up and the GIL first: two hand-offs per call)."""
        place = Work("(blocking call)", None, self)
        self._queue.append(place)
        try:
            while True:   # (a lane that took the turn without the lock tells this wait when it ends: end_turn)
                head = self._queue[0]
                if (head is place or head._job is not None) and self.take():
                    if head is place:
                        self._queue.popleft()
                        break
                    self._run_head_locked()
                else:
                    self._turns.wait()
        except BaseException:   # Ctrl-C while waiting: give the place up, and stop (out of step)
            if place in self._queue:
                self._queue.remove(place)
            self._turns.notify_all()
            self.runtime.stop(f"rank {self.world_rank()}: interrupted while waiting for the calls before "
                              "this one to finish")
            raise

    def submit(self, work: Work, inline: bool = False) -> Work:
        """An async call: queue ``work`` and return it. ``inline``: its caller runs it when its turn
        comes (a GPU call), in its own thread; so is every call of an unthreaded engine."""
        if inline or not self.threaded or self.turn.get(OWNER) == threading.get_ident():
            self.run_now(work._run)
            return work
        with self._turns:
            self._queue.append(work)
            self._last_submit = work.issued_at
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="collectives-progress", daemon=True)
                self._thread.start()
            if self._asleep:
                self._turns.notify_all()
        return work

    def help(self, work: Work) -> None:
        """Called by a thread about to wait for ``work``: while no call is running and async calls
        are queued up to and including ``work``, run them here, in order (waiting at once for a
        handle then costs what the blocking call costs)."""
        if self.turn.get(OWNER) == threading.get_ident():   # (a done-callback's wait: its call holds the turn)
            return
        with self._lock:
            while work in self._queue and self._queue[0]._job is not None and self.take():
                self._run_head_locked()

    def _run_head_locked(self) -> None:
        """(Holding the lock and the turn, an async call at the head) run that call in this thread,
        with the lock released meanwhile; then hand the turn back. A Ctrl-C in it is this thread's
        too: its handle keeps it, and it goes on up from here (the blocking call or the wait that ran
        the call, in place of the error the runtime it stopped would give them)."""
        work = self._queue.popleft()
        self._lock.release()
        try:
            work._run()   # (never raises: the handle keeps the call's error)
        finally:
            self._lock.acquire()
            self._release_locked()
        if isinstance(work._error, KeyboardInterrupt):
            raise KeyboardInterrupt

    def _release(self) -> None:
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        self.turn.clear()   # (end_turn's, under the lock)
        if self._queue or self._closing:   # someone waits for the turn (see _wait_for_turn, _serve, close)
            self._turns.notify_all()

    def _serve(self) -> None:
        """The engine thread: run queued calls until closed."""
        while True:
            with self._turns:
                while True:
                    if self._closing and not self._queue:
                        return
                    head = self._queue[0] if self._queue else None
                    if head is not None and head._job is not None and not self.turn:
                        young = _PICKUP_SECONDS - (perf_counter() - head.issued_at)
                        if young > 0 and not self._closing:
                            self._turns.wait(young)   # its caller may still take it (see _PICKUP_SECONDS)
                        elif self.take():
                            break
                        else:   # (a call took the turn this moment: its end tells, the queue not being empty)
                            self._turns.wait()
                    elif perf_counter() - self._last_submit < _ACTIVE_SECONDS:
                        self._turns.wait(_PICKUP_SECONDS)
                    else:
                        self._asleep = True
                        self._turns.wait()
                        self._asleep = False
                work = self._queue.popleft()
            try:
                work._run()   # (its waits nap: the caller computes meanwhile, see Bound.background)
            finally:
                del work   # (a dropped handle is collected here, not at the next call)
                self._release()

    def in_background(self) -> bool:
        """Whether the calling thread is the engine's own (a call it runs has the caller computing beside it)."""
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def world_rank(self) -> int:
        return self.runtime.world.rank() if self.runtime.world is not None else -1

    def close(self, reason: str = "") -> None:
        """At exit: let the calls still queued run (or, with a ``reason``, stop them), then end the
        engine thread. Each call is bounded by its own timeout; a stopped one ends at its next poll."""
        if reason:
            self.runtime.stop(reason)
        with self._turns:
            self._closing = True
            self._turns.notify_all()
            while self.turn or self._queue:
                self._turns.wait()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

