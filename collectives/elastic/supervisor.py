"""The supervisor of a rank under MPICH's launcher: a parent process that waits for the rank, so
that the launcher sees a plain exit where the rank died by a signal (``supervise``), and a job
that went on without that rank and finished exits 0 (``stand_by``, ``report_finished``). Part of
``collectives.elastic`` (which re-exports ``supervise``), in a module of its own: it runs before
MPI starts and knows nothing of the runtime but the pipe of ``collectives.process.changes.spawned_here``.

The job's word reaches the supervisor of a dead rank over TCP. Inside ``col.elastic.run`` every
rank holds a connection to every other rank's supervisor, on which it says nothing until its
``run`` returns (then ``b"0"``: the job finished). For 3 ranks, after rank 2 is killed::

    rank 0 --- supervisor of 1          rank 0 and rank 1 go on, finish, each sends b"0"
    rank 0 --- supervisor of 2          the supervisor of 2 reads a b"0": it exits 0, not 137
    rank 1 --- supervisor of 0
    rank 1 --- supervisor of 2          (had both failed or died instead, their kernels would
    rank 2 --- supervisors of 0, 1       close both connections without a word: it exits 137)

No timeout is needed: the dead rank's supervisor waits while a connection is open, and each closes
when the process holding it ends, however it ends.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import socket
import sys
import time
from typing import Iterator, Sequence

from collectives.process import changes


def supervise() -> None:
    """Run the rest of this program in a child process, this one waiting for it and exiting with
    its status (128 + the signal, if a signal ended it). Call it first thing, before MPI starts.

    MPICH's launcher (hydra's proxy) SIGKILLs every rank on a host once one of the processes it
    started is found ended by a signal, even under ``-disable-auto-cleanup``: the survivors of a
    kill would die at the proxy's next event (their next line of output). Under a supervisor the
    proxy sees a plain exit instead. Signals sent to the rank's process group (the launcher's
    Ctrl-C, its failure notices) reach the child directly; the supervisor ignores them. Only
    under MPICH's launcher (PMI_FD or PMI_PORT set, no Open MPI); elsewhere it does nothing.

    Where the rank dies by a signal inside ``col.elastic.run``, the supervisor waits for the
    survivors' word (see this module's docstring): 0 if they finished the job without it, else
    the rank's own status (137 after SIGKILL), so that ``mpiexec`` reports a job that recovered
    and finished as 0, as horovodrun and torchrun do.

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
    listener = socket.create_server(("", 0), backlog=socket.SOMAXCONN)   # (see _TheOthers)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:
        supervised = True
        os.close(told)
        listener.close()
        os.environ[changes.OUTLIVE_FD] = f"{tell}:{os.getpid()}"   # (changes.spawned_here writes to it)
        os.environ[_PORT] = f"{port}:{os.getpid()}"
        _die_with_parent()
        return
    os.close(tell)
    _name_this_process(b"ring-supervisor")   # (ps -o comm, top, pgrep: not the rank, whose pid the trainer prints)
    if os.environ.get("PMI_FD", "").isdigit():
        os.close(int(os.environ["PMI_FD"]))   # (the launcher sees the child's end when the child ends: see _OUTLIVE_SECONDS)
    others = _TheOthers(listener)
    code, said = _watch(child, told, _launchers_notices(), others)
    if code > 128 and (b"e" in said or b"1" in said):   # (b"1": a newcomer, or a job that grew: elastic too)
        code = _await_word(others, code)
    if b"1" in said:
        time.sleep(_OUTLIVE_SECONDS)
    os._exit(code)


supervised = False   # this process runs under a supervisor (see supervise)


def stand_by(hosts: Sequence[str], ports: Sequence[int]) -> None:
    """In the rank: hold a connection to the supervisor of every other rank of the world (world
    rank r on ``hosts[r]``, its supervisor listening on ``ports[r]``; 0: none), that it may hear
    this job's word if its rank dies (see ``report_finished``). Connections made at an earlier
    change are kept; one that cannot be made is left out (that supervisor then reports its rank's
    own status). ``col.elastic.run`` calls it at the start and after every change."""
    mine = (socket.gethostname(), own_port())
    changes.tell_supervisor(b"e")
    for address in zip(hosts, ports):
        if address[1] and address != mine and address not in _standing_by:
            try:
                _standing_by[address] = socket.create_connection(address, timeout=_CONNECT_SECONDS)
            except OSError:
                pass


@contextlib.contextmanager
def reporting() -> Iterator[None]:
    """Around ``col.elastic.run``'s work: ``report(finished=True)`` once it returns, ``report(finished=False)``
    if it raises (a rank stuck in its own code is then ended by its supervisor)."""
    try:
        yield
    except BaseException:
        report(finished=False)
        raise
    report(finished=True)


def report(finished: bool) -> None:
    """In the rank, when ``col.elastic.run`` returns (``finished``) or raises: tell every
    supervisor stood by. A supervisor whose rank died reports 0 for a finished job; one whose rank
    still runs once every other rank has ended after a failure ends it (see ``_watch``). After a
    failure the connections stay open until this process ends, however long its exit takes."""
    for connection in _standing_by.values():
        try:
            connection.sendall(_FINISHED if finished else _FAILED)
        except OSError:
            pass
    if finished:
        for connection in _standing_by.values():
            connection.close()
        _standing_by.clear()


def own_port() -> int:
    """The port on which this process's supervisor listens (0: it has none)."""
    port, _, pid = os.environ.get(_PORT, "").partition(":")
    return int(port) if port.isdigit() and pid == str(os.getpid()) else 0


_PORT = "COLLECTIVES_SUPERVISOR_PORT"
_FINISHED, _FAILED = b"0", b"x"
_CONNECT_SECONDS = 5.0
_standing_by: dict[tuple[str, int], socket.socket] = {}   # (host, port) of a supervisor -> our connection


class _TheOthers:
    """The supervisor's side of ``stand_by``: the connections of the other ranks, accepted as they
    come, and what they said before they closed."""

    def __init__(self, listener: socket.socket):
        listener.setblocking(False)
        self.listener, self.open, self.said, self.ever = listener, [], b"", False

    def look(self, seconds: float) -> None:
        """Accept new connections and read what has come, waiting up to ``seconds`` for a word."""
        try:
            while True:
                self.open.append(self.listener.accept()[0])
                self.ever = True
        except OSError:   # (BlockingIOError: none waiting)
            pass
        for connection in select.select(self.open, [], [], seconds)[0] if self.open else ():
            try:
                word = connection.recv(16)
            except OSError:
                word = b""
            self.said += word
            if not word:
                self.open.remove(connection)
                connection.close()

    def finished(self) -> bool:
        return _FINISHED in self.said

    def all_gone_after_a_failure(self) -> bool:
        """Every other rank that stood by has ended, one at least saying the job failed."""
        return self.ever and not self.open and _FAILED in self.said and not self.finished()


def _launchers_notices() -> list[float]:
    """Leave the launcher's signals to the child (they reach it directly); return the list to which
    the launcher's failure notices (SIGUSR1) add when each came."""
    noticed: list[float] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda signum, frame: noticed.append(time.monotonic()))
    return noticed


def _await_word(others: _TheOthers, code: int) -> int:
    """The child died of a signal inside an elastic run: 0 once a rank says the job finished,
    ``code`` once every rank that stood by has ended without saying so (or if none did)."""
    while True:
        others.look(_LOOK_SECONDS)
        if others.finished():
            print(f"[rank {os.environ.get('PMI_RANK', '?')}] collectives: the job finished without this rank (it "
                  f"died of signal {code - 128}): its status is 0", file=sys.stderr, flush=True)
            return 0
        if not others.open:
            return code


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


def under_hydra() -> bool:
    """Whether MPICH's launcher (hydra) started this process (Open MPI's sets PMI_* too at times)."""
    return "OMPI_COMM_WORLD_RANK" not in os.environ and bool({"PMI_FD", "PMI_PORT"} & os.environ.keys())


def _watch(child: int, told: int, noticed: list[float], others: _TheOthers) -> tuple[int, bytes]:
    """Wait for the child; return its exit status (128 + the signal that ended it) and what it said
    on ``told`` (``changes.mpi_started``: b"m"; ``stand_by``: b"e"; ``changes.spawned_here``: b"1"). End it, saying why,
    where it would wait for ever inside MPI, out of the runtime's reach:

    - a failure notice came and MPI has not started in it _START_GRACE seconds later: MPI_Init
      waits for ever for a process of the job that died (every survivor of a kill in the first
      0.15 s of a job spun there, in 5 runs of 6);
    - a newcomer that has not joined the job within ``changes.JOIN_SECONDS``: a member that died
      while the members spawned it leaves it waiting in its MPI_Init or the merge;
    - an elastic rank still running _ALONE_GRACE seconds after every other rank has ended, one
      of them saying the job failed: stuck in its own code (the others timed out naming it),
      it would hold the launcher for ever (``mpiexec -disable-auto-cleanup`` kills nobody)."""
    said, began, reading, alone_since = b"", time.monotonic(), True, math.inf
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
        others.look(0)
        now, why = time.monotonic(), ""
        alone_since = min(alone_since, now) if others.all_gone_after_a_failure() else math.inf
        if now - alone_since > _ALONE_GRACE:
            why = (f"every other rank of this elastic job ended after a failure {_ALONE_GRACE:g} s ago, and this rank "
                   "still runs (stuck in its own code?)")
        elif noticed and b"m" not in said and now - noticed[0] > _START_GRACE:
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
_ALONE_GRACE = 5.0     # seconds a rank may still take to end once every other rank ended after a failure
#: In a job that spawned processes (the child said b"1"), the supervisor outlives its child by this
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

