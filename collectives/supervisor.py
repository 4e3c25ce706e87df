"""The supervisor of a rank under MPICH's launcher: a parent process that waits for the rank, so
that the launcher sees a plain exit where the rank died by a signal (``supervise``). Part of
``collectives.elastic`` (which re-exports it), in a module of its own: it runs before MPI starts
and knows nothing of the runtime but the pipe of ``collectives.changes.spawned_here``.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

from collectives import changes


def supervise() -> None:
    """Run the rest of this program in a child process, this one waiting for it and exiting with
    its status (128 + the signal, if a signal ended it). Call it first thing, before MPI starts.

    MPICH's launcher (hydra's proxy) SIGKILLs every rank on a host once one of the processes it
    started is found ended by a signal, even under ``-disable-auto-cleanup``: the survivors of a
    kill would die at the proxy's next event (their next line of output). Under a supervisor the
    proxy sees a plain exit instead. Signals sent to the rank's process group (the launcher's
    Ctrl-C, its failure notices) reach the child directly; the supervisor ignores them. Only
    under MPICH's launcher (PMI_FD or PMI_PORT set, no Open MPI); elsewhere it does nothing.

    In a job that spawned newcomers, the supervisor also outlives its child by a moment (see
    ``_told``), so that MPICH's launcher does not die of its own notices at the job's end. A
    newcomer's supervisor ends it if it has not joined the job within ``changes.JOIN_SECONDS``.

    >>> col.elastic.supervise()       # the first line of the program          # doctest: +SKIP
    """
    global supervised
    if not under_hydra() or "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    told, tell = os.pipe()
    child = os.fork()
    if child == 0:
        supervised = True
        os.close(told)
        os.environ[changes.OUTLIVE_FD] = f"{tell}:{os.getpid()}"   # (changes.spawned_here writes to it)
        _die_with_parent()
        return
    os.close(tell)
    if os.environ.get("PMI_FD", "").isdigit():
        os.close(int(os.environ["PMI_FD"]))   # (the launcher sees the child's end when the child ends: see _told)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    joined = _await_joining(child, told) if changes.joining() else b""
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if joined or _told(told):
        time.sleep(_OUTLIVE_SECONDS)   # (see _told)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


supervised = False   # this process runs under a supervisor (see supervise)


def under_hydra() -> bool:
    """Whether MPICH's launcher (hydra) started this process (Open MPI's sets PMI_* too at times)."""
    return "OMPI_COMM_WORLD_RANK" not in os.environ and bool({"PMI_FD", "PMI_PORT"} & os.environ.keys())


def _await_joining(child: int, told: int) -> bytes:
    """A newcomer's supervisor: wait until the child says it joined the job (``changes.spawned_here``
    writes to ``told``), or ends; after ``changes.JOIN_SECONDS`` end it. A member that died while
    the members spawned it leaves it waiting inside MPI (its MPI_Init, or the merge), for ever."""
    ready, _, _ = select.select([told], [], [], changes.JOIN_SECONDS)
    if ready:
        return os.read(told, 1)   # (b"": it ended first)
    print(f"collectives: a newcomer (pid {child}) could not join the running job within {changes.JOIN_SECONDS:.0f} s "
          "(the members gave up its spawn); it ends", file=sys.stderr, flush=True)
    os.kill(child, signal.SIGKILL)
    return b""


_OUTLIVE_SECONDS = 0.5


def _told(told: int) -> bool:
    """Whether the child said (through ``told``, see ``changes.spawned_here``) that the job has
    spawned processes: then the supervisor outlives it by _OUTLIVE_SECONDS.

    MPICH's launcher (hydra 5, under -disable-auto-cleanup) answers every process's end, even a
    normal one, with a notice to the proxy of each other process group on its host (the
    newcomers of each spawn are one), and dies of SIGPIPE if that proxy has already ended: the
    job's last processes end together, so the launcher exited with 141 about half the time. The
    proxy lives as long as a process it started does: this supervisor (which closed its copy of
    the launcher's connection, so that its child's end is the one reported) is that process."""
    os.set_blocking(told, False)   # (a process the child forked may hold the pipe open still)
    try:
        return bool(os.read(told, 1))
    except OSError:
        return False


def _die_with_parent() -> None:
    """The supervised child ends with its supervisor (prctl PR_SET_PDEATHSIG: Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass

