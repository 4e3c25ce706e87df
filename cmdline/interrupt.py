"""Ctrl-C in a program whose ranks must stop together (``python -m trainer``, ``python -m bench``).

A rank must never leave a loop alone: the others would wait for it in their next collective.
So while :func:`stop_on_ctrl_c` is active, Ctrl-C (SIGINT: ``mpiexec`` forwards it to every
rank, ``kill -INT`` reaches one) only raises a flag; the program carries the flag to every
rank in a collective it makes anyway, or in one small all-reduce per step, and every rank
stops at the same point. A second Ctrl-C on a rank raises KeyboardInterrupt there at once.

>>> with stop_on_ctrl_c():
...     requested()
False
"""
from __future__ import annotations

import contextlib
import signal

_pressed = [False]


def requested() -> bool:
    """Whether Ctrl-C was pressed on this rank since :func:`stop_on_ctrl_c` began."""
    return _pressed[0]


@contextlib.contextmanager
def stop_on_ctrl_c():
    """While inside: the first Ctrl-C sets :func:`requested`; a second raises KeyboardInterrupt."""
    def ask(signum, frame):
        if _pressed[0]:
            raise KeyboardInterrupt
        _pressed[0] = True

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _pressed[0] = False
