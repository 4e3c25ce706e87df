"""The launcher's failure notices: MPICH's ``mpiexec``, told not to clean up after a failure
(``-disable-auto-cleanup``), tells the surviving processes that one died by SIGUSR1.

Counted from MPI's start by the runtime (``collectives.process.startup.mpi``: a death before the setup
must be heard there) until the process has said its farewell (``collectives.process.leaving``), then ignored. Apart from ``ring.transport.mpi.control`` (whose
waits read the count) because that module starts MPI when imported, and the code that installs
and removes this handler must not.
"""
from __future__ import annotations

import signal
import threading

_notices = 0   # failure notices heard from the launcher (see hear_failure_notices)
NOTICE_GRACE = 0.5   # seconds a wait goes on after a failure notice, in case the dead process was not one it waits for


def failure_notices() -> int:
    """How many failure notices the launcher has sent this process (see hear_failure_notices)."""
    return _notices


class NoticeWatch:
    """For a wait that cannot tell who died (a world's first setup; not a spawn, whose members see
    every death among them directly: ``collectives.process.changes.spawn_newcomers``): the launcher's
    notice is its only word of a death, and the death may not concern it, so it gives up only
    once a notice (beyond the ``heeded`` first ones) has gone unanswered for NOTICE_GRACE seconds.

    >>> watch = NoticeWatch(heeded=failure_notices())
    >>> watch.grace_over(now=100.0)   # no notice since
    False
    """

    def __init__(self, heeded: int) -> None:
        self.heeded, self.noticed = heeded, float("inf")

    def grace_over(self, now: float) -> bool:
        if self.noticed == float("inf") and failure_notices() > self.heeded:
            self.noticed = now
        return now - self.noticed >= NOTICE_GRACE


def hear_failure_notices() -> None:
    """SIGUSR1's default action ends the process at once, silently, before it can say who died.
    Where the program has no handler of its own (and this is its main thread), count the notices
    instead: a wait looks at its peers at once after one."""
    if (threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1")
            and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL):
        signal.signal(signal.SIGUSR1, _count_notice)


def ignore_failure_notices() -> None:
    """At exit, once this process has said farewell: a notice is a cue to nothing any more, and
    Python's finalization puts SIGUSR1's default action (end at once) back in place of the counting
    handler, so a late notice (a rank died while this one finalized) ended a process that had
    reported everything with "signal 10". An ignored signal stays ignored through finalization."""
    if (threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1")
            and signal.getsignal(signal.SIGUSR1) is _count_notice):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _count_notice(signum, frame) -> None:
    global _notices
    _notices += 1
