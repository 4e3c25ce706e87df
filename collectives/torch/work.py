"""The torch ``Work`` of the ring backend: every error the runtime raises reaches torch.

torch meets a call's outcome through three doors, and each must carry the runtime's error:

==========================================  =============================================
door                                        what the caller gets when the call failed
==========================================  =============================================
``dist.all_reduce(t)`` (``wait()`` inside)  the runtime's error, raised (as torch's types)
``work.wait()``, ``work.exception()``       raised; the error
``work.get_future()`` (DDP's reducer)       a future completed *with an error*, so that
                                            ``loss.backward()`` raises it instead of reading
                                            a result that is not there
==========================================  =============================================

torch's own ``Future.set_exception`` stores the exception as a value that only Python
unwraps; torch's C++ (DDP's reducer, ``_create_work_from_future``) sees a successful future
and goes on with garbage. A future whose ``then`` callback raises is marked failed in C++
itself, so :meth:`RingWork.get_future` returns such a child.
"""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist
from torch.futures import Future

import collectives as col
from ring.transport.base import TransportTimeout


class RingUsageError(col.CollectiveUsageError, RuntimeError):
    """A usage error raised through torch: the runtime's ``CollectiveUsageError``, and a
    ``RuntimeError`` as gloo's argument errors are, so code written for either catches it."""


class RingBackendError(col.CollectiveError, dist.DistBackendError):
    """A failure raised through torch (a peer that left, died or is late): the runtime's
    ``CollectiveError``, and torch's ``DistBackendError`` as gloo's are."""


class RingMembershipChanged(RingBackendError, col.MembershipChanged):
    """A call on a process group of the world before a change (``collectives.elastic``), issued
    after it or in flight across it: the runtime's ``MembershipChanged`` raised through torch.
    Destroy the process group and make it again (``init_process_group``) on the new world."""


def for_torch(error: BaseException) -> BaseException:
    """``error`` as torch callers expect it (the runtime's text, and the runtime's error kept as the
    cause); a timeout says so in the words torch's tests look for (`` timeout ``)."""
    if isinstance(error, col.CollectiveUsageError) and not isinstance(error, RuntimeError):
        return _chained(RingUsageError(str(error)), error)
    if isinstance(error, col.MembershipChanged) and not isinstance(error, dist.DistBackendError):
        return _chained(RingMembershipChanged(str(error), error.before, error.after), error)
    if isinstance(error, col.CollectiveError) and not isinstance(error, dist.DistBackendError):
        text = str(error)
        if isinstance(error.__cause__, TransportTimeout):
            text += " (the call's timeout ran out: raise it, or COLLECTIVES_TIMEOUT, if the ranks are only slow)"
        return _chained(RingBackendError(text), error)
    return error


def _chained(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


class RingWork(dist.Work):
    """torch's handle on one call of the runtime (a ``col.Work``, a ``col.Request``, or nothing
    for a call already done): ``wait()`` raises what the call raised, ``get_future()`` carries
    it, ``exception()``/``is_success()`` report it. ``after(result)`` puts the runtime's result
    into torch's tensors, once, before anyone sees the call as done. ``bound``: the seconds a
    wait without its own timeout may take (a point-to-point call; a collective has its own).

    >>> work = dist.all_reduce(t, async_op=True)        # doctest: +SKIP
    >>> work.wait()                                     # raises if any rank failed  # doctest: +SKIP
    True
    """

    def __init__(self, call: Any, tensors: list, after: Callable[[Any], None] | None = None,
                 error: BaseException | None = None, bound: float | None = None):
        super().__init__()
        self._call, self._tensors, self._after, self._bound = call, tensors, after, bound
        self._error = None if error is None else for_torch(error)
        self._settled = call is None
        self._lock = threading.Lock()
        self._future: Future | None = None
        self._peer = -1   # the rank a receive came from

    @classmethod
    def done(cls, tensors: list, error: BaseException | None = None) -> "RingWork":
        """The handle of a call that has already finished (or failed with ``error``)."""
        return cls(None, tensors, error=error)

    def _settle(self, timeout: float | None = None) -> None:
        """Wait for the call (running it in this thread if it is still queued: no thread hop for a
        handle waited at once), then put its result in place or keep its error. Idempotent."""
        if self._settled:
            return
        result, error = None, None
        try:
            result = self._call.wait(timeout or self._bound)
        except Exception as failed:   # noqa: BLE001 - kept for every door (KeyboardInterrupt goes through)
            if not getattr(self._call, "is_completed", lambda: True)():   # (the wait refused, the call not yet
                raise for_torch(failed) from failed   # run: a done-callback's wait for a later one; it is not the call's)
            error = failed
        with self._lock:
            if self._settled:
                return
            if error is None and self._after is not None:
                try:
                    self._after(result)
                except Exception as failed:   # noqa: BLE001 - the call's own outcome
                    error = failed
            if error is None and isinstance(result, int):
                self._peer = result
            self._error = None if error is None else for_torch(error)
            self._settled = True

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call is done; raise its error. ``timeout`` bounds this wait only, as
        gloo's does: on expiry it raises RingBackendError and the call goes on in the background
        (bounded by its own timeout), the group usable and its ranks in step; a later ``wait()``
        returns its result. (``col.Work.wait(timeout)`` instead stops the runtime.) torch's 0
        means no bound."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if seconds and not self._settled and hasattr(self._call, "add_done_callback"):
            finished = threading.Event()
            self._call.add_done_callback(lambda _: finished.set())
            if not finished.wait(seconds):
                raise RingBackendError(f"wait: timed out after {seconds:g} s, before the call finished; it goes on "
                                       "(wait() again for its result)")
        self._settle(seconds or None)
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> Future:
        """A future that completes with the tensors, or fails with the call's error (for a
        point-to-point call, made by waiting for it).

        Its ``then`` callbacks run in the call's turn on the runtime's engine, in the thread that
        finished the call, and the calls they issue run at once there: PowerSGD's P and Q follow
        the bucket's all-reduce on every rank, whatever DDP issues meanwhile for the next bucket
        (``collectives.calls.progress.Work.add_done_callback``). A callback attached once the
        future is done runs at once in the attaching thread, as torch's own futures do."""
        with self._lock:
            if self._future is not None:
                return self._future
            source: Future = Future()
            self._future = source.then(_value_or_raise)
        if self._settled or not hasattr(self._call, "add_done_callback"):
            self._complete(source)
        else:   # (in the call's turn: the calls torch's callbacks issue follow it on every rank)
            self._call.add_done_callback(lambda _: self._complete(source))
        return self._future

    def _complete(self, source: Future) -> None:
        """Settle the call and complete ``source``: the ``then`` callbacks attached so far run here,
        under the main thread's empty name, which the runtime's cross-rank check compares. The
        thread that finishes a call differs from rank to rank (the engine's, or a caller's that ran
        it), and the calls the callbacks issue must pair (PowerSGD's P and Q)."""
        self._settle()
        thread = threading.current_thread()
        name, thread.name = thread.name, ""
        try:
            source.set_result(self._tensors if self._error is None else self._error)
        finally:
            thread.name = name

    def is_completed(self) -> bool:
        return self._settled or (hasattr(self._call, "is_completed") and self._call.is_completed())

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._settled and self.is_completed():
            self._settle()
        return self._error

    def result(self) -> list:
        self.wait()
        return self._tensors

    def source_rank(self) -> int:
        """The rank (in the group) a receive from any rank came from, once waited."""
        self.wait()
        return self._peer

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self._settled else "running"
        return f"<RingWork {state}: {self._call!r}>"


def _value_or_raise(future: Future) -> Any:
    """(A ``then`` callback) raise the error a call ended with: torch then marks the child failed."""
    value = future.value()
    if isinstance(value, BaseException):
        raise value
    return value
