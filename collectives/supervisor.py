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
    ``_OUTLIVE_SECONDS``), so that MPICH's launcher does not die of its own notices at the job's end. A
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
        os.close(int(os.environ["PMI_FD"]))   # (the launcher sees the child's end when the child ends: see _OUTLIVE_SECONDS)
    noticed: list[float] = []   # when the launcher's failure notices came
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda signum, frame: noticed.append(time.monotonic()))
    code, said = _watch(child, told, noticed)
    if b"1" in said:
        time.sleep(_OUTLIVE_SECONDS)
    os._exit(code)


supervised = False   # this process runs under a supervisor (see supervise)


def under_hydra() -> bool:
    """Whether MPICH's launcher (hydra) started this process (Open MPI's sets PMI_* too at times)."""
    return "OMPI_COMM_WORLD_RANK" not in os.environ and bool({"PMI_FD", "PMI_PORT"} & os.environ.keys())


def _watch(child: int, told: int, noticed: list[float]) -> tuple[int, bytes]:
    """Wait for the child; return its exit status (128 + the signal that ended it) and what it said
    on ``told`` (``changes.mpi_started``: b"m"; ``changes.spawned_here``: b"1"). End it, saying why,
    where it would wait for ever inside MPI, out of the runtime's reach:

    - a failure notice came and MPI has not started in it _START_GRACE seconds later: MPI_Init
      waits for ever for a process of the job that died (every survivor of a kill in the first
      0.15 s of a job spun there, in 5 runs of 6);
    - a newcomer that has not joined the job within ``changes.JOIN_SECONDS``: a member that died
      while the members spawned it leaves it waiting in its MPI_Init or the merge."""
    said, began, reading = b"", time.monotonic(), True
    while True:
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:
            if reading:
                os.set_blocking(told, False)   # (a process the child forked may hold the pipe open still)
                try:
                    said += os.read(told, 16)
                except OSError:
                    pass
            return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)), said
        if reading and select.select([told], [], [], _LOOK_SECONDS)[0]:
            got = os.read(told, 16)
            said, reading = said + got, bool(got)
        elif not reading:
            time.sleep(_LOOK_SECONDS)
        now, why = time.monotonic(), ""
        if noticed and b"m" not in said and now - noticed[0] > _START_GRACE:
            why = "a process of this job died while MPI was starting here, and MPI_Init would wait for it for ever"
        elif changes.joining() and b"1" not in said and now - began > changes.JOIN_SECONDS:
            why = (f"this newcomer could not join the running job within {changes.JOIN_SECONDS:.0f} s (the members "
                   "gave up its spawn)")
        if why:
            print(f"[rank {os.environ.get('PMI_RANK', '?')}] collectives: {why}; it ends", file=sys.stderr,
                  flush=True)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return 1, said


_LOOK_SECONDS = 0.05   # between the supervisor's looks at its child
_START_GRACE = 0.5     # seconds MPI may still take to start in the child after a failure notice
#: In a job that spawned processes (the child said b"1"), the supervisor outlives its child by this
#: much. MPICH's launcher (hydra 5, under -disable-auto-cleanup) answers every process's end, even a
#: normal one, with a notice to the proxy of each other process group on its host (the newcomers of
#: each spawn are one), and dies of SIGPIPE if that proxy has already ended: the job's last
#: processes end together, so the launcher exited with 141 about half the time. The proxy lives as
#: long as a process it started does: this supervisor (which closed its copy of the launcher's
#: connection, so that its child's end is the one reported) is that process.
_OUTLIVE_SECONDS = 0.5


def _die_with_parent() -> None:
    """The supervised child ends with its supervisor (prctl PR_SET_PDEATHSIG: Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass

