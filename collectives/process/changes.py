"""Changes of the world's membership: the survivors of a death make a world of their own, and
newcomers join one. Below ``collectives.elastic`` (which decides when), beside group making;
``collectives.process.startup.rebuild`` puts the new world in place of the old one.

The survivors first agree on who is gone (``ring.transport.mpi.survivors``), then make their
communicator with MPI's Comm_create_group, which only they call. Newcomers are spawned by
every member together (MPI's Comm_spawn) and merged with them into one communicator, the
members' ranks first, in their order. Either way the new world is set up as the first one was
(``collectives.process.startup.set_up``: its own duplicate, hosts, liveness), so its groups, levels and
the cost model's view are those of a fresh start.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from collectives.errors import CollectiveError
from collectives.process import ending, supervision
from ring.transport.base import TransportError
from ring.transport.host_waits import GivenUp, watched

#: The interpreter option (``python -X collectives_joining ...``) that its spawners give a newcomer:
#: it joins a world instead of starting one. (Not an environment variable: MPICH's launcher starts
#: spawned processes with its own environment, not the spawner's. An -X option leaves the
#: program's sys.argv as it was.)
JOINING = "collectives_joining"


@dataclass(frozen=True)
class Change:
    """One change of the world: ``gone`` (world ranks before it that died or left), ``joined`` (how
    many newcomers), the sizes ``before`` and ``after``, and ``text``, the line that says so.

    >>> Change(gone=(3,), joined=0, before=4, after=3).text
    'rank 3 gone: 4 -> 3 ranks'
    """
    gone: tuple[int, ...]
    joined: int
    before: int
    after: int
    text: str = field(default="")

    def __post_init__(self):
        if not self.text:
            parts = []
            if self.gone:
                parts.append(f"rank{'s' if len(self.gone) > 1 else ''} {', '.join(map(str, self.gone))} gone")
            if self.joined:
                parts.append(f"{self.joined} joined")
            object.__setattr__(self, "text", f"{' and '.join(parts) or 'no change'}: {self.before} -> "
                                             f"{self.after} ranks")


def survivors_communicator(world, until: float):
    """Every survivor of the world group ``world``: agree on who is gone and make the communicator
    of the others; returns (gone world ranks, communicator)."""
    transport = world.transport
    try:
        from ring.transport.mpi import survivors   # (imported here: importing it starts MPI)
        gone, comm = survivors.survivors(transport, until)
        return tuple(gone), comm
    except TransportError as e:
        raise CollectiveError(f"the survivors of rank(s) {world.lost()} could not agree on "
                              f"a new world: {e}") from e


#: How long a newcomer may take to join (its supervisor ends it then, see ``collectives.elastic.supervisor``);
#: the members give up on a spawn a little later (``spawn_newcomers``).
JOIN_SECONDS = 20.0


class SpawnFailed(CollectiveError):
    """The members gave up on a spawn (``inside_mpi``: a member or a newcomer died meanwhile, or the
    newcomers did not join in time; the spawn is left behind, inside MPI for good, as MPI cannot
    cancel one), or MPI's spawn failed (the launcher could not start the newcomers)."""

    def __init__(self, message: str, inside_mpi: bool):
        super().__init__(message)
        self.inside_mpi = inside_mpi


def grow(world, comm, count: int, hosts: list[str], until: float) -> tuple[tuple[int, ...], object, str]:
    """Every member of the world group ``world`` (``comm``: its communicator): spawn ``count``
    newcomers and return (nobody gone, the communicator of members and newcomers, ""); if the
    spawn is given up, the members that live (and whose MPI still answers: ``leave_if_held``)
    make a communicator of their own: (the gone, that communicator, " (why)")."""
    try:
        return (), spawn_newcomers(comm, count, hosts, until, world.lost), ""
    except SpawnFailed as e:
        leave_if_held(comm, world.rank(), e)
        gone, comm = survivors_communicator(world, until)
        return gone, comm, f" ({e})"


def spawn_newcomers(comm, count: int, hosts: list[str], until: float, dead: Callable[[], list[int]],
                    argv: list[str] | None = None):
    """Every member of ``comm`` together: start ``count`` newcomers running this program (``argv``:
    default this interpreter's own arguments, ``-u``, ``-m module`` and all), one on each of
    ``hosts`` in turn where given (else wherever the launcher puts them), and return the
    communicator of members and newcomers, members first. Only rank 0's arguments count (MPI's
    spawn reads the root's).

    MPI's spawn blocks until every newcomer has joined (``join_spawners``), and for ever if a
    member or a newcomer dies meanwhile: it runs in a thread of its own, while this one watches
    ``dead()`` (the members known dead) and the time (``until``, at most JOIN_SECONDS and a little
    more), and raises SpawnFailed on the first. Both leave the spawn stuck on every member, so the
    members agree on its outcome. Not the launcher's failure notice: it does not say whose death
    it tells (seen: a rank that had just left, or the newcomer of a spawn given up before, gave the
    next spawn up), and a member that gives the spawn up while it ends on the others splits the job
    in two worlds, each waiting for the other (seen: a notice to one member alone).

    One spawn of ``count`` processes with the hosts as one comma-separated list (MPI's "host"
    info key), not one per host: MPICH's launcher keeps only the last host of a Spawn_multiple."""
    from mpi4py import MPI
    args = ["-X", JOINING, *(_without_mark(sys.orig_argv[1:]) if argv is None else _python_args(list(argv)))]

    def spawn():
        info = MPI.Info.Create()
        if hosts:
            info.Set("host", ",".join(hosts[:count]))
        try:
            inter = comm.Spawn(sys.executable, args, count, info, root=0)
            merged = _errors_returned(inter.Merge(high=False))
            inter.Disconnect()
            return merged
        finally:
            info.Free()

    until = min(until, time.monotonic() + JOIN_SECONDS + 5.0)

    def give_up() -> str:
        died = dead()   # (once a look: it reads every local peer's process and liveness)
        late = time.monotonic() > until
        return f"rank(s) {died} died" if died else "the newcomers did not join in time" if late else ""

    try:
        merged = watched(spawn, 0.01, give_up, "collectives spawn")
    except GivenUp as e:
        raise SpawnFailed(f"the spawn of {count} newcomer(s) was given up: {e}", inside_mpi=True) from None
    except Exception as e:   # (an MPI error: the launcher could not start them)
        raise SpawnFailed(f"the spawn of {count} newcomer(s) failed: {e}", inside_mpi=False) from None
    spawned_here()
    return merged


def leave_if_held(comm, rank: int, failure: SpawnFailed, seconds: float = 1.0) -> None:
    """After a spawn was given up: end this process (status 1) if MPI no longer answers here.
    The spawn's root (rank 0 of ``comm``) leaves whenever its spawn stays inside MPI: that spawn
    keeps MPI's lock nearly all the time, so a probe may get through once and the next call wait
    for ever (seen: a job of one rank whose newcomer died before it joined). Another member leaves
    if a probe does not answer within ``seconds``. A rank that leaves cannot take part in a new
    world; the others count it among the gone."""
    if (failure.inside_mpi and rank == 0) or not _answers(comm, seconds):
        ending.print_line(f"[rank {rank}] collectives: MPI stays held by a spawn that was given up ({failure}); this "
                          "process cannot go on and ends (status 1); the ranks left, if any, go on without it")
        sys.stdout.flush()
        os._exit(1)


_PROBE_TAG = 13   # (never sent: leave_if_held only asks MPI whether it answers)


def _answers(comm, seconds: float) -> bool:
    """Whether a probe on ``comm`` returns within ``seconds`` (a thread left inside MPI by a spawn
    given up may hold MPI's lock)."""
    try:
        watched(lambda: comm.Iprobe(tag=_PROBE_TAG), seconds, lambda: "MPI does not answer", "collectives probe")
    except GivenUp:
        return False
    return True


def joining() -> bool:
    """Whether this process was spawned to join a running job (``spawn_newcomers`` marks it)."""
    return JOINING in sys._xoptions


def join_spawners():
    """In a newcomer (started by ``spawn_newcomers``): the communicator of its spawners and the
    newcomers, spawners first; None in a process that was not spawned."""
    from mpi4py import MPI
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    merged = _errors_returned(_errors_returned(parent).Merge(high=True))
    parent.Disconnect()
    spawned_here()
    return merged


def _errors_returned(comm):
    """``comm``, its MPI errors returned (raised by mpi4py) rather than fatal. mpi4py sets that on
    MPI.COMM_WORLD, whence the communicators made from it inherit it; a newcomer's parent
    communicator had MPI's default, so an error there (a member that died: "process_vm_readv ...
    No such process") ended the newcomer instead of reaching the runtime."""
    from mpi4py import MPI
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def spawned_here() -> None:
    """Tell this process's supervisor, if it has one, that the job now has spawned processes (or
    that this newcomer joined): it outlives this process by a moment (``collectives.elastic.supervisor``
    says why). Its last word: the pipe closes."""
    supervision.tell(supervision.Word.SPAWNED, last=True)


def _without_mark(args: list[str]) -> list[str]:
    """An interpreter's arguments (its options and the program's) less the joining mark: a
    newcomer that spawns newcomers in turn gives them the mark once.

    >>> _without_mark(["-X", JOINING, "-u", "train.py", "--lr", "0.1"])
    ['-u', 'train.py', '--lr', '0.1']
    """
    args, own = list(args), []
    while args:
        arg = args.pop(0)
        if arg == "-X" and args and args[0] == JOINING:
            args.pop(0)
        elif arg != f"-X{JOINING}":
            own.append(arg)
    return own


def _python_args(argv: list[str]) -> list[str]:
    """The arguments after the interpreter that start this program again: ``-m module ...`` for a
    program started with ``python -m``, else the script and its arguments."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name[:-len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return ["-m", name, *argv[1:]]
    return list(argv)
