"""The process hooks that see a program out once it has used the runtime.

Importing ``collectives`` installs nothing: a program that imports it and never calls it exits
as it would without it. The program's first use (anything that asks ``collectives.process.world.mpi``
for MPI: ``init``, ``rank``, ``size``, any collective) installs, once per process:

- ``sys.excepthook``: notes why the process ends (an uncaught exception; Ctrl-C is an uncaught
  KeyboardInterrupt) for the farewell, then hands the exception to the hook it replaced;
- one exit handler, which says the farewell and finalizes MPI where nobody else will.

Both are removed once the process has left the runtime (the farewell, at exit or inside the
program's own ``MPI.Finalize()``): the excepthook is put back if it is still this one (torch's
``init_process_group`` wraps whatever hook it finds), and the exit handler is unregistered.
SIGUSR1 (the launcher's failure notices) is the runtime's from MPI's start to its farewell:
``ring.transport.mpi.notices``.
"""
from __future__ import annotations

import atexit
import sys
import threading
from typing import Callable

_why_leaving = ""               # set by the excepthook: why this process is ending
_previous_excepthook = sys.__excepthook__   # the hook this one replaced (and hands exceptions to)
_at_exit: Callable[[], None] | None = None  # the exit handler registered, until it is removed
_installed = False              # once per process: a process that has left does not come back
_installing = threading.Lock()  # (two threads' first uses: a second install would make the hook call itself)


def why_leaving() -> str:
    """Why this process is ending, if an uncaught exception ends it ("" otherwise)."""
    return _why_leaving


def _note_uncaught(kind, value, traceback) -> None:
    """sys.excepthook: remember why the process is ending, then report it as the previous hook did."""
    global _why_leaving
    _why_leaving = f"uncaught {kind.__name__}" + (f": {value}" if str(value) else "")
    _previous_excepthook(kind, value, traceback)


def install(at_exit: Callable[[], None]) -> None:
    """At the program's first use of the runtime: the excepthook, and ``at_exit`` as an exit handler
    (registered now, so it runs before the exit handlers the program registered earlier). Once per
    process: later calls, and calls after ``remove``, do nothing."""
    global _installed, _previous_excepthook, _at_exit
    with _installing:
        if _installed:
            return
        _installed = True
        _previous_excepthook, sys.excepthook = sys.excepthook, _note_uncaught
        _at_exit = at_exit
        atexit.register(at_exit)


def remove() -> None:
    """Once the process has left the runtime: put the excepthook back if it is still this one (a hook
    installed over it keeps calling it, which does no harm), and unregister the exit handler (at exit
    it is running: unregistering it then stops nothing)."""
    global _at_exit
    if sys.excepthook is _note_uncaught:
        sys.excepthook = _previous_excepthook
    if _at_exit is not None:
        atexit.unregister(_at_exit)
        _at_exit = None
