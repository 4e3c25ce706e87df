"""The process's life, in one owner: how it started (MPI, its supervisor), the world it is a member
of, why it is ending, and the hooks that see it out. The rest asks ``life`` and tells it what
happened through its methods; only this module writes its fields (tests/test_process_life.py
checks that), as only ``Runtime.stop`` writes the failure state. What the launchers say is read
from the environment by ``collectives.process.launchers``; how the process ends (its status and its
last line) is decided from what ``life`` holds by ``collectives.process.ending``.

The hooks: importing ``collectives`` installs nothing, so a program that imports it and never
calls it exits as it would without it. The program's first use (anything that asks
``collectives.process.startup.mpi`` for MPI: ``init``, ``rank``, ``size``, any collective) installs,
once per process (``install_hooks``):

- ``sys.excepthook``: notes why the process ends (an uncaught exception; Ctrl-C is an uncaught
  KeyboardInterrupt) for the farewell, then hands the exception to the hook it replaced;
- one exit handler, which says the farewell and finalizes MPI where nobody else will.

Both are removed once the process has left the runtime (the farewell, at exit or inside the
program's own ``MPI.Finalize()``): the excepthook is put back if it is still this one (torch's
``init_process_group`` wraps whatever hook it finds), and the exit handler is unregistered.
SIGUSR1 (the launcher's failure notices) is the runtime's from MPI's start to its farewell:
``ring.transport.mpi.notices``.

>>> life = Life()
>>> life.world is None, life.why_ending, life.work_finished
(True, '', False)
>>> life.finish_work(); life.work_finished
True
"""
from __future__ import annotations

import atexit
import sys
import threading
from typing import Callable

from collectives.calls import interrupts
from collectives.groups.group import Group


class Life:
    """Everything the process knows of its own life; one per process (``life``)."""

    def __init__(self) -> None:
        #: Start: this runtime started MPI (the program had told mpi4py not to); it told its supervisor.
        self.started_mpi = False
        self.told_started = False
        #: This process runs under a supervisor (``collectives.elastic.supervise``).
        self.supervised = False
        #: Membership: the world group once set up (``collectives.process.startup.world()`` sets it up).
        self.world: Group | None = None
        #: This process took part in a setup (a rank that did never joins another at exit); one timed out.
        self.joined_setup = False
        self.setup_missed = False
        self.setup_lost_a_process = False   # a setup ended as a process of the job had ended (MPI_Finalize would hang)
        #: MPI.Finalize() tells the runtime first (watched once, at the first setup).
        self.finalize_watched = False
        #: A newcomer to an elastic job has entered ``col.elastic.run`` (its next runs are the job's).
        self.arrived = False
        #: ``col.elastic.run`` returned: a rank that dies after it no longer fails this one.
        self.work_finished = False
        self._uncaught = ""   # why the process is ending, as the excepthook noted it (see why_ending)
        self._uncaught_kind: type | None = None   # (and the exception's class)
        self._previous_excepthook = sys.__excepthook__   # the hook ours replaced, and hands exceptions to
        self._exit_handler: Callable[[], None] | None = None   # registered, until removed
        self._hooks_installed = False   # once per process: a process that has left does not come back
        self._installing = threading.Lock()   # (two threads' first uses: a second install would loop the hook)

    # Start.

    def mpi_started_by_us(self) -> None:
        self.started_mpi = True

    def first_time_mpi_started(self) -> bool:
        """Whether this is the first time MPI is seen started here (the supervisor is told once)."""
        first, self.told_started = not self.told_started, True
        return first

    def under_supervisor(self) -> None:
        self.supervised = True

    # Membership.

    def set_world(self, world: Group) -> None:
        """The world group set up, or rebuilt after a change of membership."""
        self.world = world

    def took_part_in_setup(self) -> None:
        self.joined_setup = True

    def missed_setup(self, missed: bool, lost_a_process: bool = False) -> None:
        self.setup_missed, self.setup_lost_a_process = missed, lost_a_process

    def watch_finalize(self) -> bool:
        """Whether MPI.Finalize() is to be watched now (the first setup only)."""
        first, self.finalize_watched = not self.finalize_watched, True
        return first

    def arrive(self) -> None:
        """A process (a newcomer, or any rank) has entered ``col.elastic.run``."""
        self.arrived = True

    # The farewell.

    def finish_work(self) -> None:
        """Said by ``col.elastic.run`` when it returns: the job's work is done."""
        self.work_finished = True

    def install_hooks(self, at_exit: Callable[[], None]) -> None:
        """At the program's first use of the runtime: the excepthook, and ``at_exit`` as an exit handler
        (registered now, so it runs before the exit handlers the program registered earlier). Once per
        process: later calls, and calls after ``remove_hooks``, do nothing."""
        with self._installing:
            if self._hooks_installed:
                return
            self._hooks_installed = True
            self._previous_excepthook, sys.excepthook = sys.excepthook, self._note_uncaught
            self._exit_handler = at_exit
            atexit.register(at_exit)
            interrupts.install()   # (a Ctrl-C as a call ends is held back to its end)

    def remove_hooks(self) -> None:
        """Once the process has left the runtime: put the excepthook back if it is still ours (a hook
        installed over it keeps calling it, which does no harm), and unregister the exit handler (at
        exit it is running: unregistering it then stops nothing)."""
        if sys.excepthook == self._note_uncaught:
            sys.excepthook = self._previous_excepthook
        if self._exit_handler is not None:
            atexit.unregister(self._exit_handler)
            self._exit_handler = None

    def _note_uncaught(self, kind, value, traceback) -> None:
        """sys.excepthook: remember why the process is ending, then report it as the previous hook did.
        Only an exception that ends the program counts (``_ends_the_program``): a program that
        reports one it handled through the hook, as ``code.InteractiveInterpreter`` does, or a
        thread's, goes on."""
        if _ends_the_program(traceback) and not _still_running(traceback.tb_frame):
            self._uncaught, self._uncaught_kind = _uncaught(kind, value), kind
        self._previous_excepthook(kind, value, traceback)

    @property
    def why_ending(self) -> str:
        """Why the process is ending ("": no uncaught exception), as the excepthook noted it; where the
        program put a hook of its own over ours after its first use of the runtime (a pretty-printer of
        tracebacks, say), the exception Python itself keeps of a script that ends uncaught
        (``sys.last_value``; not in an interactive session, which keeps its earlier ones there)."""
        if self._uncaught or not self._hooks_installed or sys.excepthook == self._note_uncaught:
            return self._uncaught
        last = getattr(sys, "last_value", None)
        ended = isinstance(last, BaseException) and _ends_the_program(getattr(sys, "last_traceback", None))
        return _uncaught(type(last), last) if ended else ""

    @property
    def ends_interrupted(self) -> bool:
        """Whether an uncaught KeyboardInterrupt ends the program: Python then ends the process by
        SIGINT, once its exit handlers have run."""
        if self._uncaught_kind is not None:
            return issubclass(self._uncaught_kind, KeyboardInterrupt)
        return bool(self.why_ending) and isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)


def _ends_the_program(traceback) -> bool:
    """Whether the exception of ``traceback`` may end the program: raised on the main thread and caught
    by none of the program's functions, its traceback starts at the bottom of the stack (the main
    module's code, or runpy's that ran it), where one that a function caught and reported (through
    the excepthook, say, as ``code.InteractiveInterpreter`` does) starts in that function. (One
    the main module's own code caught starts there too: the excepthook tells it by
    ``_still_running``.) Never in an interactive session, which goes on after each.

    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError as e:
    ...     caught = e.__traceback__
    >>> _ends_the_program(caught), _ends_the_program(None)   # (a doctest's code runs inside doctest's)
    (False, False)
    """
    return (traceback is not None and traceback.tb_frame.f_back is None
            and threading.current_thread() is threading.main_thread()
            and not hasattr(sys, "ps1") and not sys.flags.interactive)


def _still_running(frame) -> bool:
    """Whether ``frame`` is on the caller's stack: the excepthook asks of the frame an exception's
    traceback starts in, which a program that caught the exception and reports it is still running
    (a ``try`` of the main module's own code, say); one that ends the program has left it.

    >>> import sys; _still_running(sys._getframe())
    True
    """
    running = sys._getframe(1)
    while running is not None:
        if running is frame:
            return True
        running = running.f_back
    return False


def _uncaught(kind: type, value: BaseException) -> str:
    """How a farewell says an uncaught exception: ``uncaught ValueError: bad input``."""
    return f"uncaught {kind.__name__}" + (f": {value}" if str(value) else "")


#: This process's life.
life = Life()
