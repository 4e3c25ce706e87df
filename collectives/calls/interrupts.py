"""Ctrl-C held back while a call keeps its books.

A call's end on the main thread is bookkeeping that must not stop halfway: the error handling of a
call that failed (``call.ended``: cancel what it posted, stop the runtime, tell the others), or, once
its data has moved, the release of the engine's turn. Python raises KeyboardInterrupt at whichever
bytecode the signal finds, so a Ctrl-C there left a call done on every rank that this rank's program
was told was interrupted (a program that caught it and called again then paired its calls with the
others' next ones: wrong data, no error), or its persistent requests still active, or the turn held
for ever. So the runtime's SIGINT handler (in place of Python's default one, never of a program's
own) holds a Ctrl-C that comes in those moments, and the call hands it over at its very end
(:func:`settle`): the runtime stopped first, as for a Ctrl-C inside the call, so that the next call
raises instead of pairing with the others' next one.

    >>> held.on = True; _on_ctrl_c(signal.SIGINT, None); held.pending   # (a Ctrl-C in the books)
    True
    >>> stops = []
    >>> try:
    ...     settle(lambda: stops.append("stopped"))
    ... except KeyboardInterrupt:
    ...     print("KeyboardInterrupt, once the runtime stopped")
    KeyboardInterrupt, once the runtime stopped
    >>> stops, held.on, held.pending
    (['stopped'], False, False)

Only the main thread holds Ctrl-C back (Python runs signal handlers there alone).
"""
from __future__ import annotations

import signal
import threading
from typing import Callable


class _Held:
    """``on``: the main thread is in a call's books; ``pending``: a Ctrl-C came meanwhile. (Set and
    read by single attribute stores and loads: no bytecode between them where a signal is handled.)"""

    __slots__ = ("on", "pending")

    def __init__(self) -> None:
        self.on = False
        self.pending = False


held = _Held()


def install() -> None:
    """Put :func:`_on_ctrl_c` in place of Python's default SIGINT handler (from the main thread; a
    handler the program installed is left alone, and so is one it installs later)."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def _on_ctrl_c(signum: int, frame: object) -> None:
    if held.on:
        held.pending = True
        return
    signal.default_int_handler(signum, frame)   # (raises KeyboardInterrupt, as without the runtime)


def settle(stop: Callable[[], object]) -> None:
    """The last step of a call on the main thread that held Ctrl-C back: where one came, ``stop()``
    the runtime (if the call's own failure has not already) and raise KeyboardInterrupt."""
    if held.pending:
        try:
            stop()
        finally:
            held.pending = False
            held.on = False
        raise KeyboardInterrupt
    held.on = False
