"""A time bound on device work that the host does not wait for.

The NCCL transport queues its work on a stream and returns at once. If a peer
never posts its side (stuck, or gone under a launcher that does not end the job),
that work never finishes, and whoever synchronizes the stream later (a
``loss.item()`` three lines on) would wait forever without a word. The watchdog
turns that into an error: after each piece of queued work the transport records
an event with the deadline of the collective that queued it; a daemon thread looks
at the oldest unfinished event every ``period`` seconds and, once its deadline has
passed, calls ``on_expiry`` once (the NCCL transport aborts its communicator,
which ends the stuck kernels, and says why). For example, with deadlines 10 and 20::

    t=0   watch(e1, 10), watch(e2, 20)    pending: e1 e2
    t=5   e1 done                         pending: e2
    t=20  e2 not done, deadline passed -> on_expiry("... 20 s ..."); the thread ends
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable


class Watchdog:
    """Calls ``on_expiry(message)`` once if watched work is unfinished past its deadline."""

    def __init__(self, on_expiry: Callable[[str], None], period: float = 0.5):
        self._on_expiry = on_expiry
        self._period = period
        self._pending: collections.deque[tuple[Any, float]] = collections.deque()   # (event, deadline)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.expired = ""   # the message given to on_expiry, once it was called

    def watch(self, event: Any, deadline: float) -> None:
        """Watch ``event`` (anything with ``.done``), due by ``deadline`` (a time.monotonic() value)."""
        with self._lock:
            if self._pending and self._pending[-1][1] == deadline:
                self._pending[-1] = (event, deadline)   # the same collective: its later work covers the earlier
            else:
                self._pending.append((event, deadline))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="collectives-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            overdue = self._overdue()
            if overdue is not None:
                self.expired = (f"device work queued by a collective was still unfinished {overdue:.3g} s "
                                "after that collective's deadline (a peer never did its part)")
                self._on_expiry(self.expired)
                return

    def _overdue(self) -> float | None:
        """Seconds the oldest unfinished work is past its deadline (None: nothing is overdue)."""
        with self._lock:
            while self._pending and self._pending[0][0].done:
                self._pending.popleft()
            if not self._pending:
                return None
            late = time.monotonic() - self._pending[0][1]
        return late if late > 0 else None
