"""Changes of the world's membership: the survivors of a death make a world of their own, and
newcomers join one. Below ``collectives.elastic`` (which decides when), beside group making;
``collectives.world.rebuild`` puts the new world in place of the old one.

The survivors first agree on who is gone (``ring.transport.survivors``), then make their
communicator with MPI's Comm_create_group, which only they call. Newcomers are spawned by
every member together (MPI's Comm_spawn) and merged with them into one communicator, the
members' ranks first, in their order. Either way the new world is set up as the first one was
(``collectives.world.set_up``: its own duplicate, hosts, liveness), so its groups, levels and
the cost model's view are those of a fresh start.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from collectives.errors import CollectiveError
from ring.transport.base import TransportError

#: Set in a newcomer's environment by its spawners: it joins a world instead of starting one.
JOINING = "COLLECTIVES_JOINING"


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
        from ring.transport import survivors   # (imported here: importing it starts MPI)
        gone = survivors.agree_on_the_gone(transport, until)
        return tuple(gone), survivors.survivors(transport, gone)
    except TransportError as e:
        raise CollectiveError(f"the survivors of rank(s) {transport.control.known_dead()} could not agree on "
                              f"a new world: {e}") from e


def spawn_newcomers(comm, count: int, hosts: list[str], argv: list[str] | None = None):
    """Every member of ``comm`` together: start ``count`` newcomers running this program (``argv``:
    default ``sys.argv``), one on each of ``hosts`` in turn where given ("": wherever the launcher
    puts them), and return the communicator of members and newcomers, members first."""
    from mpi4py import MPI
    argv = list(sys.argv if argv is None else argv)
    command, args = sys.executable, _python_args(argv)
    requests = [(command, args, 1, _info_for(host)) for host in (hosts or [""] * count)[:count]]
    requests += [(command, args, 1, MPI.INFO_NULL)] * (count - len(requests))
    commands, argvs, counts, infos = (list(x) for x in zip(*requests))
    os.environ[JOINING] = "1"   # (the spawned processes inherit the environment of the launcher's spawner)
    try:
        inter = comm.Spawn_multiple(commands, argvs, counts, infos, root=0)
    finally:
        del os.environ[JOINING]
    merged = inter.Merge(high=False)
    inter.Disconnect()
    return merged


def join_spawners():
    """In a newcomer (started by ``spawn_newcomers``): the communicator of its spawners and the
    newcomers, spawners first; None in a process that was not spawned."""
    from mpi4py import MPI
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    merged = parent.Merge(high=True)
    parent.Disconnect()
    return merged


def _python_args(argv: list[str]) -> list[str]:
    """The arguments after the interpreter that start this program again: ``-m module ...`` for a
    program started with ``python -m``, else the script and its arguments."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name[:-len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return ["-m", name, *argv[1:]]
    return list(argv)


def _info_for(host: str):
    from mpi4py import MPI
    if not host:
        return MPI.INFO_NULL
    info = MPI.Info.Create()
    info.Set("host", host)
    return info
