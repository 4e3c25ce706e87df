"""Ctrl-C and SIGTERM in a program whose ranks must stop together (``python -m trainer``, ``python -m bench``).

A rank must never leave a loop alone: the others would wait for it in their next collective.
So while :func:`stop_together` is active, Ctrl-C (SIGINT: ``mpiexec`` forwards it to every rank,
``kill -INT`` reaches one) and SIGTERM (a batch system's preemption or requeue, ``scancel``,
``kill``: to every rank or to one) only raise a flag; the program carries the flag to every rank
in a collective it makes anyway, or in one small all-reduce per step, and every rank stops at the
same point. A second Ctrl-C on a rank raises KeyboardInterrupt there at once.

>>> with stop_together():
...     requested()
0
"""
from __future__ import annotations

import contextlib
import signal

#: What :func:`requested` says, the larger winning where ranks heard different signals (a
#: preemption must write its checkpoint whatever else was asked).
CTRL_C, PREEMPTED = 1, 2

_heard = [0]


def requested() -> int:
    """What this rank was asked since :func:`stop_together` began: 0 (nothing), CTRL_C (SIGINT)
    or PREEMPTED (SIGTERM)."""
    return _heard[0]


def agreed(asked: int) -> int:
    """What the ranks agreed on (the largest any of them heard) becomes this rank's too, so that
    every rank, not only those SIGTERM reached, leaves a preemption with late SIGTERMs ignored."""
    _heard[0] = max(_heard[0], asked)
    return asked


@contextlib.contextmanager
def stop_together(finishing: bool = False):
    """While inside: SIGINT and SIGTERM set :func:`requested`; a second SIGINT raises KeyboardInterrupt.
    Leaving after a SIGTERM leaves SIGTERM ignored (the process is ending: see below).

    ``finishing``: the block is the program's work, and the process ends after it (the last lines,
    the runtime's exit barrier, MPI_Finalize): once the block returns, SIGTERM and Ctrl-C are
    ignored (a batch system's late SIGTERM, a Ctrl-C to a job that just finished), so that a finished
    job is not reported failed by a signal during its exit. Ignored, not handled: Python puts its
    handlers back to the default action as it shuts down, after the exit handlers, and a signal that
    came then ended the process (a Ctrl-C 30-60 ms after the trainer's last line). A block left by an
    exception puts the handlers back as without it.
    """
    def ctrl_c(signum, frame):
        if _heard[0]:
            raise KeyboardInterrupt
        _heard[0] = CTRL_C

    def preempted(signum, frame):
        _heard[0] = PREEMPTED

    previous = signal.signal(signal.SIGINT, ctrl_c), signal.signal(signal.SIGTERM, preempted)
    done = False
    try:
        yield
        done = finishing
    finally:
        if done:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGINT, previous[0])
            # After a preemption a later SIGTERM is the same one, come late (the batch system signals every task,
            # and the launcher too): the rank is on its way out with its checkpoint written, and must not die of it.
            signal.signal(signal.SIGTERM, signal.SIG_IGN if _heard[0] == PREEMPTED else previous[1])
        _heard[0] = 0
