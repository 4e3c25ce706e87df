"""What one process's groups share: the settings in force, the progress engine that runs their
calls one at a time, the choice of algorithm, and whether the runtime has stopped here.

Below the groups (``collectives.groups.group``), which hold a Runtime; it knows them only as a list of
``CallGroup`` (``collectives.calls.group_protocol``).
The runtime is the one owner of the failure state: :meth:`Runtime.stop` is the only way to set
it (the first failure wins) and every module reads it (``runtime.failure``). Nothing clears it:
the ranks are out of step. A recovery among the survivors (``collectives.process.startup.rebuild``)
replaces the whole runtime instead, and retires this one (:meth:`Runtime.retire`).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from collectives.calls import progress, table
from collectives.calls.config import Settings
from ring import cost
from ring.partition import chunk_bounds
from ring.transport.base import MPIOnlyTransport, Transport

if TYPE_CHECKING:   # (the groups' protocol names the runtime: a real import would be a circle)
    from collectives.calls.group_protocol import CallGroup

#: Whether a call on a group whose ranks span hosts takes two levels, by the algorithm it would
#: otherwise take (see Runtime.algorithm_for).
_TWO_LEVEL_REPLACES = ("halving", "ring")


@dataclass(frozen=True)
class Failure:
    """Why the runtime stopped on this rank (see :meth:`Runtime.stop`).

    ``text``: the failure as every later call names it; ``by_peer``: another rank caused it (a
    timeout, a peer gone); ``root_cause``: where a rank died, how every rank should hear of it
    (see ``ring.transport.base.PeerLost``), and ``dead_rank``, which (world rank); ``patience``: the
    failed call's own timeout, which bounds how long this rank's exit waits for the others
    (``collectives.process.leaving``): a rank it timed out on need not hold it longer.
    """
    text: str
    by_peer: bool = False
    root_cause: str | None = None
    dead_rank: int | None = None
    patience: float | None = None   # how long the exit waits for the others after it (None: the timeout)


class Runtime:
    """The settings in force (``settings``), the engine, the groups this rank belongs to (the world
    first), and the failure state, which it alone writes (:meth:`stop`)."""

    def __init__(self, settings: Settings, threads_checked: str = "", threaded: bool = False,
                 outlived: bool = False):
        self.apply(settings)
        self.groups: list[CallGroup] = []             # the groups this rank belongs to, the world first
        self.world = None                  # the world group, once made
        #: Whether this rank has taken part in making a group (a member or not): the world's census
        #: then cannot tell a rank in no call from one in a call of a group (``call._census``).
        self.grouped = False
        self.failure: str | None = None       # why a failure left this rank out of step (read-only: see stop)
        self.stopped_by: Failure | None = None   # ... and the whole record, for the farewell that passes it on
        #: Set with the failure: every wait in flight ends at its next look (it is each call's
        #: ``Bound.stop``: see ``ring.transport.base``).
        self.stopped = threading.Event()
        self._stopping = threading.Lock()
        self.engine = progress.Engine(self, threaded)   # runs the calls one at a time, in issue order
        self.threads_checked = threads_checked   # MPI's thread level, where only its main thread may call ("": any)
        self.closed = False                # the process has left (see leave)
        self.retired: str | None = None    # why a new world replaced this runtime's (see retire)
        #: This world is not MPI's whole world (ranks died, or it joined processes spawned later):
        #: MPI_Finalize would wait for ever for the dead, so the process ends without it.
        self.outlived = outlived

    def apply(self, settings: Settings) -> None:
        """Put ``settings`` in force (every rank together: see ``init``), and choose again."""
        self.settings = settings
        self._choices: dict = {}   # (collective, ranks, bytes, host, two levels[, wire ratio]) -> algorithm
        #: The algorithm remembered for ``algorithm_for``'s arguments as a tuple, or None: the
        #: lookup alone, which a small call makes before paying for a call of algorithm_for.
        self.chosen = self._choices.get
        #: The express lanes of small collectives (``collectives.ops.express``), which the settings shape,
        #: and the lane of each collective that ran last (``express._kept``).
        self.lanes: dict = {}
        self.last_allreduce = self.last_broadcast = self.last_allgather = None
        #: Each lane's calls as one function, where the lane of that collective that ran last has one
        #: (``collectives.ops.fused``): the module's ``allreduce``, ``broadcast`` and ``allgather``, and
        #: the Group's methods, try it first.
        self.fused_allreduce: Callable | None = None
        self.fused_broadcast: Callable | None = None
        self.fused_allgather: Callable | None = None

    def algorithm_for(self, op: str, n: int, nbytes: int, host: bool = True, two_level: bool = False,
                      wire_ratio: float = 1.0) -> str:
        """The algorithm that runs ``op`` on ``n`` ranks and ``nbytes`` when the call forces none:
        the setting (COLLECTIVES_ALGORITHM) where ``op`` has it, else the cost model's choice, and
        "hierarchical" for an all-reduce on a group whose ``two_level`` layout allows it (unless
        recursive doubling is chosen); on two ranks, a collective whose repeats take an express lane
        by every algorithm (``table.LANED``, up to a segment) is priced by what the lanes cost
        (``cost.LANES``). Recursive doubling is for host arrays up to ``small_bytes``;
        GPU arrays take the ring. The same on every rank for the same call (remembered: choosing
        costs more than a small call). ``wire_ratio``: a compressed all-reduce's bytes on the wire per
        byte of data (``ring.cost``)."""
        key = (op, n, nbytes, host, two_level) if wire_ratio == 1.0 else (op, n, nbytes, host, two_level, wire_ratio)
        found = self._choices.get(key)
        if found is None:
            if len(self._choices) >= 4096:
                self._choices.clear()
            s = self.settings
            if not host:
                found = "ring"
            elif s.algorithm in cost.candidates(op, nbytes, s.small_bytes):
                found = s.algorithm
            elif s.algorithm in cost.ALGORITHMS["allreduce"]:   # forced, but not for this call
                found = "ring"
            else:   # (priced as its repeats run: in an express lane, whatever the algorithm, on two ranks)
                lanes = op in table.LANED and n == 2 and host and not two_level and wire_ratio == 1.0 \
                    and nbytes <= s.segment()
                found = cost.choose(op, n, nbytes, cost.LANES if lanes else cost.MEASURED, segment_bytes=s.segment(),
                                    check=s.check, doubling_bytes=s.small_bytes, wire_ratio=wire_ratio)
            if two_level and op == "allreduce" and found in _TWO_LEVEL_REPLACES:
                found = "hierarchical"
            self._choices[key] = found
        return found

    def stop(self, failure: str, error: BaseException | None = None, by_peer: bool = False,
             patience: float | None = None, tell: bool = True, group: CallGroup | None = None) -> str:
        """Stop the runtime on this rank: it is out of step with some peers because of ``failure``
        (``by_peer``: another rank caused it; an ``error`` that says a rank died gives the root
        cause and that rank, passed on at exit; ``patience``: see Failure). The first failure stands:
        a later one (the same failure seen again on its way out) changes nothing. Every wait in
        flight ends at its next look, every later call raises, and (``tell``) every group's other
        members hear after which of its calls this rank stopped (``Group.give_up``), so that a rank
        that reaches one of them late fails it too: those of ``group`` (where the failure happened,
        which a late rank is about to end) first, since MPI moves a pair's messages in the order they were
        sent. Returns the failure in force.

        >>> from collectives.calls.config import defaults
        >>> r = Runtime(defaults())
        >>> r.stop("allreduce #3 on rank 1: timed out"), r.stop("later"), r.stopped.is_set()
        ('allreduce #3 on rank 1: timed out', 'allreduce #3 on rank 1: timed out', True)
        """
        with self._stopping:   # (the engine's thread and a program thread may fail at once)
            first = self.stopped_by is None
            if first:
                self.stopped_by = Failure(failure, by_peer, getattr(error, "root", None), getattr(error, "dead", None),
                                          patience)
                self.failure = failure   # (a plain attribute, read by every call: tests/test_layout.py checks
                self.stopped.set()       # that no other module writes it)
        if first and tell:
            root = self.stopped_by.root_cause
            for member in sorted(self.groups, key=lambda g: g is not group):
                member.give_up(root or failure, by_peer, root is not None, self.stopped_by.dead_rank)
        return self.failure

    def leave(self) -> Failure | None:
        """The process leaves the runtime (``collectives.process.leaving``): every later call is refused,
        as after a failure; returns the failure that came before, if any, to pass on."""
        before = self.stopped_by
        self.closed = True
        self.stop("this process has left the runtime (at exit or MPI.Finalize())", tell=False)   # (its farewell tells)
        return before

    def exit_patience(self, failure: Failure | None) -> float:
        """How long this rank's exit waits for the others to reach theirs after ``failure``, the one
        that came before it left (``leave``; None: a healthy run): for ever after a healthy run (the
        others may end long after this rank, whatever the timeout); after a failure, the failed
        call's own timeout (a rank it timed out on need not hold this one longer), else the setting's.

        >>> from collectives.calls.config import defaults
        >>> r = Runtime(defaults(timeout=0.3))
        >>> r.exit_patience(r.leave())
        inf
        >>> r = Runtime(defaults(timeout=0.3))
        >>> r.stop("allreduce #3 on rank 1: timed out", patience=3.0, tell=False)
        'allreduce #3 on rank 1: timed out'
        >>> r.exit_patience(r.leave())
        3.0
        """
        return math.inf if failure is None else failure.patience or self.settings.timeout

    def retire(self, change: str) -> None:
        """A new world replaced this runtime's (``collectives.process.startup.rebuild``): ``change`` says how.
        Its groups and calls still in flight raise MembershipChanged from now on (its engine was
        closed before the change began)."""
        self.stop(change, by_peer=True, tell=False)   # (the new world's members agreed on it together)
        self.retired = change

    def segment_elems(self, dtype: np.dtype, transport: Transport | None = None) -> int:
        """The ring's segment in elements of ``dtype`` on ``transport``: the setting, else (0, the
        default) 4 MiB, or 1 MiB on a transport whose ranks span hosts."""
        return max(1, self.settings.segment(getattr(transport, "spans_hosts", False)) // dtype.itemsize)

    def two_level_hosts(self, transport: MPIOnlyTransport, ranks: tuple[int, ...], world: bool) -> list | None:
        """The host of each rank of a group over ``transport`` (world ``ranks``) where its all-reduce
        takes two levels (the setting allows it, and so does the layout), else None."""
        if self.settings.algorithm not in ("auto", "hierarchical"):
            return None
        hosts = hosts_of(ranks, transport.hosts, self.settings.hosts, len(ranks) if world else self.world.size())
        return None if two_level_layout(hosts) else hosts


def hosts_of(ranks: tuple[int, ...], real_hosts: list[str], declared: int, world_size: int) -> list:
    """The host of each of ``ranks`` (world ranks): their real hosts, or with ``declared`` hosts
    (COLLECTIVES_HOSTS), the block of consecutive world ranks each falls in.

    >>> hosts_of((0, 1, 2, 3, 4), ["a"] * 5, 2, 5)
    [0, 0, 0, 1, 1]
    """
    if not declared:
        return list(real_hosts)
    block = [h for h, (start, stop) in enumerate(chunk_bounds(world_size, declared)) for _ in range(start, stop)]
    return [block[r] for r in ranks]


def two_level_layout(hosts: list) -> str:
    """Why the hierarchical all-reduce cannot run over ranks on ``hosts`` ("" if it can): it needs
    more than one host and the same number of ranks, more than one, on each.

    >>> two_level_layout([0, 0, 1, 1]), two_level_layout([0, 0, 0, 1, 1])
    ('', 'the hosts have different numbers of ranks (3, 2)')
    """
    counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
    if len(counts) < 2:
        return "all ranks are on one host"
    if len(set(counts.values())) > 1:
        return f"the hosts have different numbers of ranks ({', '.join(map(str, counts.values()))})"
    if max(counts.values()) < 2:
        return "each host has one rank"
    return ""
