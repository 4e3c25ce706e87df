"""The supervisor of a rank under MPICH's launcher: a parent process that waits for the rank, so
that the launcher sees a plain exit where the rank died by a signal (``supervise``); it also ends
its rank where the rank would wait for ever out of the runtime's reach (see ``_watch``), and
reports 0 for a job that finished without its dead rank (``collectives.elastic.outcome``). Part of
``collectives.elastic`` (which re-exports ``supervise``), in a module of its own: it runs before
MPI starts and knows nothing of the runtime but the words its rank says (``collectives.process.supervision``).
"""
from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import socket
import sys
import time
from typing import Callable

from collectives.elastic import outcome
from collectives.process import changes, ending, launchers
from collectives.process.life import life
from collectives.process.supervision import PIPE, PORT, Heard
from ring.transport.host_waits import siblings as _siblings


def supervise() -> None:
    """Run the rest of this program in a child process, this one waiting for it and exiting with
    its status (128 + the signal, if a signal ended it). Call it first thing, before MPI starts.

    MPICH's launcher (hydra's proxy) SIGKILLs every rank on a host once one of the processes it
    started is found ended by a signal, even under ``-disable-auto-cleanup``: the survivors of a
    kill would die at the proxy's next event (their next line of output). Under a supervisor the
    proxy sees a plain exit instead. Signals sent to the rank's process group (the launcher's
    Ctrl-C, its failure notices) reach the child directly; the supervisor ignores them. Only
    where MPICH's PMI started it (mpiexec, srun --mpi=pmi2: ``launchers.mpich_pmi``); else nothing.

    Where the rank dies by a signal inside ``col.elastic.run``, the supervisor waits for the
    survivors' word (``collectives.elastic.outcome``): 0 if they finished the job without it, else
    the rank's own status (137 after SIGKILL), so that ``mpiexec`` reports a job that recovered
    and finished as 0, as horovodrun and torchrun do.

    In a job that spawned newcomers, the supervisor also outlives its child by a moment (see
    ``_OUTLIVE_SECONDS``), so that MPICH's launcher does not die of its own notices at the job's end. A
    newcomer's supervisor ends it if it has not joined the job within ``changes.JOIN_SECONDS``.

    >>> col.elastic.supervise()       # the first line of the program          # doctest: +SKIP
    """
    if not launchers.mpich_pmi() or "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    told, tell = os.pipe()
    listener = socket.create_server(("", 0), backlog=socket.SOMAXCONN)   # (see outcome.TheOthers)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:
        life.under_supervisor()
        os.close(told)
        listener.close()
        os.environ[PIPE] = f"{tell}:{os.getpid()}"   # (supervision.tell writes to it)
        os.environ[PORT] = f"{port}:{os.getpid()}"
        _die_with_parent()
        return
    os.close(tell)
    _name_this_process(b"ring-supervisor")   # (ps -o comm, top, pgrep: not the rank, whose pid the trainer prints)
    if os.environ.get("PMI_FD", "").isdigit():
        os.close(int(os.environ["PMI_FD"]))   # (the launcher sees the child's end when the child ends: see _OUTLIVE_SECONDS)
    others = outcome.TheOthers(listener)
    _exit(*_watch(child, told, _launchers_notices(), others), others)


def _exit(status: int, heard: Heard, others: outcome.TheOthers) -> None:
    """End the supervisor with its rank's ``status``, or 0 where the rank died of a signal in an elastic
    job that the other ranks finished (``ending.supervised``)."""
    if ending.awaits_the_others(status, heard):
        finished = outcome.await_word(others, _LOOK_SECONDS)
        verdict = ending.supervised(_rank(), status, heard, finished_without_it=finished)
        ending.print_line(verdict.line)
        status = verdict.status
    if heard.spawned:
        time.sleep(_OUTLIVE_SECONDS)
    os._exit(status)


def _launchers_notices() -> list[float]:
    """Leave the launcher's signals to the child (they reach it directly); return the list to which
    the launcher's failure notices (SIGUSR1) add when each came."""
    noticed: list[float] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda signum, frame: noticed.append(time.monotonic()))
    return noticed


def launcher_kills_survivors() -> bool:
    """Whether this process's ``mpiexec`` (hydra's, seen among its ancestors on this host) was
    started without ``-disable-auto-cleanup``, so that it will end every rank at the first death.
    False where that cannot be seen (a rank started on another host through ssh)."""
    pid = os.getpid()
    for _ in range(6):   # (rank, supervisor, hydra_pmi_proxy, mpiexec, and a wrapper or two)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if os.path.basename(argv[0]).startswith((b"mpiexec", b"mpirun")):
            return not any(arg.lstrip(b"-") == b"disable-auto-cleanup" for arg in argv)
        if pid <= 1:
            return False
    return False


class _Reasons:
    """Why a supervisor ends its child, asked at each look (see ``_watch``)."""

    def __init__(self, noticed: list[float], others: outcome.TheOthers, clock: Callable[[], float] = time.monotonic):
        self.noticed, self.others, self.clock, self.began = noticed, others, clock, clock()
        self.alone_since = math.inf
        self.siblings: dict[int, str] = {}   # the other processes of the launcher's proxy here: pid -> rank
        self.next_sibling_look = 0.0
        self.local_ranks = launchers.started_under_proxy()    # how many the proxy started here (0: unknown)
        self.sibling_ended_at, self.ended_rank, self.ended_pid = math.inf, "?", 0   # a rank of this host that ended

    def to_end(self, said: bytes) -> str:
        """Why to end the child now, given what it ``said`` so far ("": not now)."""
        self.others.look(0)
        now, heard = self.clock(), Heard.of(said)
        started = heard.started
        if heard.finalizing:
            return self._held_in_finalize(now)
        self.alone_since = min(self.alone_since, now) if self.others.all_gone_after_a_failure() else math.inf
        if now - self.alone_since > _ALONE_GRACE:
            return (f"every other rank of this elastic job ended after a failure {_ALONE_GRACE:g} s ago, and this "
                    "rank still runs (stuck in its own code?)")
        if self.noticed and not started and now - self.noticed[0] > _START_GRACE:
            return "a process of this job died while MPI was starting here, and MPI_Init would wait for it for ever"
        if not started and now - self.sibling_ended_at > _EXIT_GRACE:
            return (f"{self.ended_rank} of this job (its supervisor's pid {self.ended_pid}, on this host) ended "
                    "before MPI started here, and MPI_Init would wait for it for ever")
        if not started and now >= self.next_sibling_look and self.sibling_ended_at == math.inf:
            self.next_sibling_look = now + _SIBLING_LOOK_SECONDS
            ended, _ = self._look_at_siblings()
            if ended:   # (the child may be ending too, for the same reason, a usage error: it has
                # _EXIT_GRACE seconds to end by itself, with its own status)
                self.sibling_ended_at, self.ended_rank, self.ended_pid = now, _named(self.siblings[ended[0]]), ended[0]
                return ""
            unseen = self.local_ranks - 1 - len(self.siblings)
            if unseen > 0 and now - self.began > _FORK_GRACE:   # (ended before this supervisor's first look)
                return (f"{unseen} of the {self.local_ranks} processes the launcher started on this host ended "
                        "before MPI started here (before this supervisor could see them), and MPI_Init would wait "
                        "for them for ever")
        if changes.joining() and not heard.spawned and now - self.began > changes.JOIN_SECONDS:
            return (f"this newcomer could not join the running job within {changes.JOIN_SECONDS:.0f} s (the members "
                    "gave up its spawn)")
        return ""

    def _look_at_siblings(self) -> tuple[list[int], set[int]]:
        """The host's other processes now (``_siblings``), each one newly seen noted with its rank;
        returns those seen before that have ended, and those here now."""
        here = _siblings()
        ended = sorted(set(self.siblings) - here)
        self.siblings.update({pid: _rank_of(pid) for pid in here - self.siblings.keys()})
        return ended, here

    def _held_in_finalize(self, now: float) -> str:
        """The child said it went into MPI_Finalize, its elastic job finished (``Word.FINALIZING``): MPI_Finalize
        waits for every rank, for ever for one that died in there, or that saw that death first and
        left without it. Once a process of this host's that was in the job has ended, the child has
        _FINALIZE_GRACE seconds to end too."""
        if now >= self.next_sibling_look and self.sibling_ended_at == math.inf:
            self.next_sibling_look = now + _SIBLING_LOOK_SECONDS
            ended, here = self._look_at_siblings()
            if ended:
                self.sibling_ended_at, self.ended_rank = now, _named(self.siblings[ended[0]])
            elif len(here) < self.local_ranks - 1:   # (one that ended before this supervisor ever saw it: a
                self.sibling_ended_at, self.ended_rank = now, "a rank"   # busy machine, a quick death)
        if now - self.sibling_ended_at > _FINALIZE_GRACE:
            return (f"this rank's elastic job finished, but MPI_Finalize has not returned {_FINALIZE_GRACE:g} s after "
                    f"{self.ended_rank} of this host ended (it waits for ever for a rank that died in there, or "
                    "left without it)")
        return ""


def _named(rank: str) -> str:
    """A sibling as a line names it: ``rank 1``, or ``a rank`` where it ended before its rank could be read."""
    return "a rank" if rank == "?" else f"rank {rank}"


def _rank_of(pid: int) -> str:
    """The rank MPICH's launcher gave process ``pid`` (its PMI_RANK), or "?"."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found = [v for v in f.read().split(b"\0") if v.startswith(b"PMI_RANK=")]
        return found[0].split(b"=", 1)[1].decode() if found else "?"
    except OSError:
        return "?"


def _watch(child: int, told: int, noticed: list[float], others: outcome.TheOthers) -> tuple[int, Heard]:
    """Wait for the child; return its exit status (128 + the signal that ended it) and what it said
    on ``told`` (``collectives.process.supervision.Word``). End it, saying why,
    where it would wait for ever inside MPI, out of the runtime's reach:

    - a failure notice came and MPI has not started in it _START_GRACE seconds later: MPI_Init
      waits for ever for a process of the job that died (a kill in a job's first moments leaves
      every survivor spinning there);
    - a process of the job on this host (another child of the launcher's proxy) ended before MPI
      started here: MPI_Init would wait for it for ever (a rank that failed while it loaded its
      data, before its first collective, held the others there: plain MPICH does too). One that
      ended before this supervisor's first look is counted missing: fewer than the proxy's
      MPI_LOCALNRANKS were ever seen _FORK_GRACE seconds after the start (beside a CPU hog a
      rank that died at once was gone before the others looked, and they waited for ever);
    - a newcomer that has not joined the job within ``changes.JOIN_SECONDS``: a member that died
      while the members spawned it leaves it waiting in its MPI_Init or the merge;
    - an elastic rank still running _ALONE_GRACE seconds after every other rank has ended, one
      of them saying the job failed: stuck in its own code (the others timed out naming it),
      it would hold the launcher for ever (``mpiexec -disable-auto-cleanup`` kills nobody);
    - a rank of a finished elastic job still in MPI_Finalize (it said FINALIZING) _FINALIZE_GRACE
      seconds after a rank of this host ended: a rank killed after the exit barrier, or one that
      saw that death before this one and left without MPI_Finalize, holds it there for ever (the
      trainer killed after its ``done:`` line: tests/test_elastic.py). It ends with status 0: the
      work was done."""
    said, reading, reasons = b"", True, _Reasons(noticed, others)
    while True:
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:
            if reading:
                os.set_blocking(told, False)   # (a process the child forked may hold the pipe open still)
                try:
                    said += os.read(told, 16)
                except OSError:
                    pass
            return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)), Heard.of(said)
        if reading and select.select([told], [], [], _LOOK_SECONDS)[0]:
            got = os.read(told, 16)
            said, reading = said + got, bool(got)
        elif not reading:
            time.sleep(_LOOK_SECONDS)
        why = reasons.to_end(said)
        if why:   # (status 0 where the job had finished: only MPI_Finalize held the rank)
            verdict = ending.supervised(_rank(), 0, Heard.of(said), ended_because=why)
            ending.print_line(verdict.line)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return verdict.status, Heard.of(said)


def _rank() -> str:
    """This rank's number as the launcher gave it, for the supervisor's lines."""
    return os.environ.get("PMI_RANK", "?")


_LOOK_SECONDS = 0.05   # between the supervisor's looks at its child
_START_GRACE = 0.5     # seconds MPI may still take to start in the child after a failure notice
_SIBLING_LOOK_SECONDS = 0.25   # between looks at the other processes here, until MPI has started
_FORK_GRACE = 5.0      # seconds the proxy may take to start every process of this host (then one unseen has ended)
_ALONE_GRACE = 5.0     # seconds a rank may still take to end once every other rank ended after a failure
_FINALIZE_GRACE = 3.0  # seconds MPI_Finalize may still take once another rank of this host has ended
_EXIT_GRACE = 1.0      # seconds a child may still take to end by itself once another rank of this host ended before MPI
#: In a job that spawned processes (the child said SPAWNED), the supervisor outlives its child by this
#: much. MPICH's launcher (hydra 5, under -disable-auto-cleanup) answers every process's end, even a
#: normal one, with a notice to the proxy of each other process group on its host (the newcomers of
#: each spawn are one), and dies of SIGPIPE if that proxy has already ended: the job's last
#: processes end together, so the launcher exited with 141 about half the time. The proxy lives as
#: long as a process it started does: this supervisor (which closed its copy of the launcher's
#: connection, so that its child's end is the one reported) is that process.
_OUTLIVE_SECONDS = 0.5


def _name_this_process(name: bytes) -> None:
    """The name ``ps -o comm``, ``top`` and ``pgrep`` show (prctl PR_SET_NAME: Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)   # PR_SET_NAME = 15
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """The supervised child ends with its supervisor (prctl PR_SET_PDEATHSIG: Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass

