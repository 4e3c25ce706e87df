"""The elastic loop: ``run`` takes a job through every change of its world (see ``collectives.elastic``)."""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import asdict
from typing import Any, Callable

import numpy as np

from collectives.process import changes, launchers, startup
from collectives.elastic import outcome, supervisor
from collectives.api import allgather, broadcast
from collectives.process.changes import Change
from collectives.process.life import life
from collectives.elastic.discovery import Discovery
from collectives.elastic.state import State, broadcast_json
from collectives.elastic.supervisor import supervise
from collectives.errors import CollectiveError, CollectiveUsageError, MembershipChanged
from collectives.process.startup import rank, size

__all__ = ["State", "run", "supervise", "joining", "Change", "MembershipChanged"]


def run(fn: Callable[[State], Any], state: State, *, min_ranks: int = 1, max_ranks: int | None = None,
        announce: bool = True, host_discovery: str | None = None, discovery_interval: float = 1.0) -> Any:
    """Run ``fn(state)`` until it returns, through every change of the world: when a rank dies (or
    its host vanishes), the survivors make a world of their own (``collectives.process.startup.rebuild``),
    roll back to the last commit that the new rank 0 holds, and call ``fn`` again. Rank 0 prints
    one line per change.

    ``host_discovery``: a command that lists the hosts the job may use (``host:slots`` lines,
    see ``collectives.elastic.discovery``), run by rank 0 every ``discovery_interval`` seconds. At a
    commit where it lists more slots than the ranks in use (and the world is smaller than
    ``max_ranks``), every rank leaves ``fn`` from that commit, newcomers running this very
    program join as the last ranks, everyone takes rank 0's state and ``fn`` starts again. A
    newcomer calls ``run`` like the others (which takes the state from rank 0 first); until then
    it makes no collective call (setting up, rank and size are fine: ``joining()`` tells it).

    Raises what ``fn`` raises otherwise (an exception of the program ends the job, as without
    elastic), and CollectiveError when fewer than ``min_ranks`` remain.

    >>> result = col.elastic.run(train, state, min_ranks=2)         # doctest: +SKIP
    >>> result = col.elastic.run(train, state, max_ranks=8, host_discovery="./hosts.sh")  # doctest: +SKIP
    """
    _check_arguments(min_ranks, max_ranks, host_discovery, discovery_interval)
    startup.world()   # (a newcomer joins the running job here: its MPI world is itself alone)
    _check_start(min_ranks, max_ranks, announce)
    discovery = Discovery(host_discovery, discovery_interval) if host_discovery else None
    settle = _Settle(state, None, time.monotonic(), announce) if joining() else state.sync
    life.arrive()
    try:
        with outcome.reporting():   # (the job's outcome, to every rank's supervisor)
            while True:
                if discovery is not None:
                    _watch(discovery, state, max_ranks)
                try:
                    settle()   # (inside the try: a death while the ranks take rank 0's state is a change too)
                    _stand_by_the_supervisors()
                    return fn(state)
                except Exception as interruption:   # (not only CollectiveError: one that crossed torch's C++,
                    began = time.monotonic()          # as DDP's backward raises it, is a RuntimeError)
                    change = _change_world(interruption, discovery, settle)
                    if change is None:
                        raise   # the program's own error ends the job, as without elastic
                _check_size(min_ranks, f"after {change.text}")
                state.restore()
                settle = _Settle(state, change, began, announce)
    finally:
        state.at_commit(None)
        if discovery is not None:
            discovery.stop()


def joining() -> bool:
    """Whether this process was spawned into a running job and has not entered ``run`` yet.

    >>> if not col.elastic.joining():                                  # doctest: +SKIP
    ...     col.broadcast(params)      # a collective before run: not in a newcomer
    """
    return changes.joining() and not life.arrived


class _Growing(Exception):
    """Raised out of ``fn`` by a commit at which newcomers join, on every rank alike: ``count``
    of them, on ``hosts`` (rank 0's list; only its own counts for MPI's spawn)."""

    def __init__(self, count: int, hosts: list[str]):
        super().__init__(f"{count} newcomer(s) join")
        self.count, self.hosts = count, hosts


def _watch(discovery: Discovery, state: State, max_ranks: int | None) -> None:
    """Rank 0 runs the discovery script (from now: rank 0 is the lowest survivor, so it stays
    rank 0 until it dies); every commit asks whether to grow (``_grow_at_commit``)."""
    if rank() == 0:
        discovery.start()
    state.at_commit(lambda: _grow_at_commit(discovery, max_ranks))


def _grow_at_commit(discovery: Discovery, max_ranks: int | None) -> None:
    """At a commit: rank 0 decides where newcomers start (none, mostly), and tells every rank how
    many in one broadcast of one integer; if any, every rank raises _Growing."""
    hosts = []
    if rank() == 0:
        room = (max_ranks if max_ranks is not None else sys.maxsize) - size()
        hosts = discovery.newcomers(Counter(life.world.transport.hosts), room)
    count = int(broadcast(np.array([len(hosts)], np.int64), name="elastic growth")[0])
    if count:
        raise _Growing(count, hosts)


class _Settle:
    """What every rank of a new world does before ``fn`` runs again, its newcomers too (``change``
    None: they know none): take rank 0's state and change, rank 0 says what changed, then the
    program's callbacks. Called inside ``run``'s try: if a rank dies meanwhile, the next change
    takes this one's place (``merged``), and its line names both."""

    def __init__(self, state: State, change: Change | None, began: float, announce: bool):
        self.state, self.change, self.began, self.announce = state, change, began, announce
        self.done = False

    def __call__(self) -> None:
        state = self.state
        state.sync()
        fields = broadcast_json(asdict(self.change) if rank() == 0 else None, 0, "elastic change")
        change = Change(tuple(fields["gone"]), fields["joined"], fields["before"], fields["after"], fields["text"])
        self.done = True
        if self.announce and rank() == 0:
            print(f"elastic: {change.text}; back to {state.where()} (the world rebuilt in "
                  f"{time.monotonic() - self.began:.2f} s)", flush=True)
        state.changed(change)

    def merged(self, later: Change) -> Change:
        """``later``, which came before this change was settled, and this one as one change: from
        the world before this one to the one after ``later``, the gone numbered in the first
        (a newcomer of this change that died in ``later`` was never in it)."""
        first = self.change
        if self.done or first is None:
            return later
        kept = [r for r in range(first.before) if r not in first.gone]
        gone = first.gone + tuple(kept[r] for r in later.gone if r < len(kept))
        return Change(gone, first.joined + later.joined, first.before, later.after, f"{first.text}, then {later.text}")


def _stand_by_the_supervisors() -> None:
    """Every rank connects to the supervisor of every other (``outcome.stand_by``), so that a
    rank's death does not make a job that finishes without it report failure."""
    port = np.array([outcome.own_port()], np.int64)
    ports = allgather(port, name="elastic supervisors").tolist()
    outcome.stand_by(life.world.transport.hosts, ports)


def _check_arguments(min_ranks: Any, max_ranks: Any, host_discovery: Any, discovery_interval: Any) -> None:
    if not isinstance(min_ranks, int) or isinstance(min_ranks, bool) or min_ranks < 1:
        raise CollectiveUsageError(f"elastic.run: min_ranks: expected an int >= 1, got {min_ranks!r}")
    if max_ranks is not None and (not isinstance(max_ranks, int) or isinstance(max_ranks, bool)
                                  or max_ranks < min_ranks):
        raise CollectiveUsageError(f"elastic.run: max_ranks: expected None or an int >= min_ranks "
                                   f"({min_ranks}), got {max_ranks!r}")
    if host_discovery is not None and (not isinstance(host_discovery, str) or not host_discovery.strip()):
        raise CollectiveUsageError(f"elastic.run: host_discovery: expected None or a command (a string), "
                                   f"got {host_discovery!r}")
    if launchers.torch_launched():
        raise CollectiveUsageError(
            "elastic.run: torchrun (or MASTER_ADDR, RANK, WORLD_SIZE) started this process, and torchrun ends every "
            "worker at the first death and starts the job again: restart it there (torchrun --max-restarts N, with "
            "the trainer's --checkpoint-dir and --resume); for survivors that go on in-process, launch with "
            "mpiexec -disable-auto-cleanup (docs/launchers.md)")
    if host_discovery is not None and launchers.srun_directly():   # (newcomers are spawned by MPI's launcher)
        raise CollectiveUsageError("elastic.run: host_discovery: growing is not supported under srun (MPI_Comm_spawn "
                                   "through Slurm's PMI); grow inside an allocation under mpiexec (salloc or sbatch, "
                                   "then mpiexec -disable-auto-cleanup ...), or leave host_discovery out: losing "
                                   "ranks works under srun --kill-on-bad-exit=0 (docs/slurm.md)")
    if not isinstance(discovery_interval, (int, float)) or isinstance(discovery_interval, bool) \
            or not discovery_interval > 0:
        raise CollectiveUsageError(f"elastic.run: discovery_interval: expected seconds > 0, "
                                   f"got {discovery_interval!r}")


def _a_rank_is_gone() -> bool:
    """Whether the world stopped because a rank died or its host vanished (a change of
    membership), rather than because of the program (a rank that raised, a usage error)."""
    world = life.world
    return world is not None and world.runtime.failure is not None and bool(world.lost())


def _change_world(interruption: Exception, discovery: Discovery | None, settling: Any) -> Change | None:
    """After ``fn`` (or the settling of the change before, ``settling``) left: newcomers join (at
    a commit), or the survivors of a death make a world of their own (the dead ranks' hosts left
    out of discovery); None if the world did not change (the program's own error)."""
    if isinstance(interruption, _Growing):
        return startup.rebuild(newcomers=interruption.count, hosts=interruption.hosts)
    if not _a_rank_is_gone():
        return None
    hosts = life.world.transport.hosts
    change = _recover(interruption)
    if discovery is not None:
        discovery.leave_out(hosts[r] for r in change.gone)
    return settling.merged(change) if isinstance(settling, _Settle) else change


def _recover(error: Exception) -> Change:
    try:
        return startup.rebuild()
    except CollectiveError as e:
        raise CollectiveError(f"elastic: the survivors could not make a new world after {error}: {e}") from e


def _check_start(min_ranks: int, max_ranks: int | None, announce: bool) -> None:
    """The world at the start is within the bounds; rank 0 warns of a program not supervised."""
    if size() < min_ranks:   # (nobody left: the job was started with too few)
        raise CollectiveError(f"elastic: the job started with {size()} rank(s), fewer than min_ranks={min_ranks}; "
                              "start at least that many (mpiexec -disable-auto-cleanup -n N)")
    if max_ranks is not None and size() > max_ranks and not joining():
        raise CollectiveUsageError(f"elastic.run: max_ranks={max_ranks} is below the {size()} ranks of the world "
                                   "at the start")
    if rank() == 0 and announce and launchers.mpich_pmi() and not life.supervised:
        print("elastic: warning: this program did not call col.elastic.supervise() first: MPICH's launcher will "
              "kill every rank on the host of a rank killed by a signal (see docs/elastic.md)", file=sys.stderr,
              flush=True)
    if rank() == 0 and announce and launchers.mpich_pmi() and supervisor.launcher_kills_survivors():
        print("elastic: warning: mpiexec was started without -disable-auto-cleanup: it will end every rank at the "
              "first death, and the job cannot go on (mpiexec -disable-auto-cleanup -n N ...)", file=sys.stderr,
              flush=True)


def _check_size(min_ranks: int, when: str) -> None:
    if size() < min_ranks:
        raise CollectiveError(f"elastic: {size()} rank(s) left {when}, fewer than min_ranks={min_ranks}; the job ends")
