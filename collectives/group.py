"""Groups: collectives on a subset of the ranks, each subset with its own communicator.

A :class:`Group` is a set of ranks with its own communicator, sequence numbers and
cross-rank check; the world is the group of every rank. ``new_group(ranks)`` and
``split(color, key)`` (``collectives.api``) make others, and every collective runs on
one: ``g.allreduce(x)`` or ``col.allreduce(x, group=g)``. Ranks inside a group are
numbered 0..size()-1 in the group's order; ``g.ranks`` maps them back to world ranks,
which is how error messages name ranks. A 2 x 2 layout of 4 ranks::

    world rank                0   1   2   3
    split(rank // 2)  group   A   A   B   B      rows: A = [0, 1], B = [2, 3]
                      rank    0   1   0   1
    split(rank % 2)   group   C   D   C   D      columns: C = [0, 2], D = [1, 3]
                      rank    0   0   1   1

Calls on disjoint groups (A and B) run at the same time; a rank alternates between its
groups (A, then C) in the order it issues the calls, which must be an order every rank
of each group agrees with, as for MPI communicators. The settings, the progress engine
and the failure state are the process's (``collectives.world.Runtime``): a failed call
on any group stops the runtime on that rank, since it is then out of step with some peers.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.errors import CollectiveError, CollectiveUsageError
from ring.partition import chunk_bounds
from ring.transport import device as device_transports
from ring.transport.base import Transport

_SHOWN_MEMBERS = 8


def describe(ranks: tuple[int, ...]) -> str:
    """How messages name a group: its world ranks, or the first few and the count.

    >>> describe((0, 2)), describe(tuple(range(64)))
    ('group [0, 2]', 'group [0, 1, 2, 3, 4, 5, 6, 7, ... 64 ranks]')
    """
    if len(ranks) <= _SHOWN_MEMBERS:
        return f"group {list(ranks)}"
    return f"group [{', '.join(map(str, ranks[:_SHOWN_MEMBERS]))}, ... {len(ranks)} ranks]"


class Group:
    """Ranks that make collectives together: ``rank()``, ``size()``, ``ranks`` (world ranks, in
    the group's order) and every collective as a method (the same as the module-level one with
    ``group=`` this group). ``root`` of a broadcast is a rank of the group.

    >>> rows = col.split(col.rank() // 2)          # on 4 ranks: [0, 1] and [2, 3]  # doctest: +SKIP
    >>> rows.ranks, rows.rank(), rows.size()       # on world rank 3                # doctest: +SKIP
    ((2, 3), 1, 2)
    >>> rows.allreduce(np.ones(2))                                                  # doctest: +SKIP
    array([2., 2.])
    """

    def __init__(self, runtime, transport: Transport, ranks: tuple[int, ...], world: bool = False,
                 levels: tuple | None = None):
        self.runtime = runtime
        self.transport = transport
        self.ranks = tuple(ranks)
        self.is_world = world
        self.label = "" if world else describe(self.ranks)   # "": the world (messages say nothing more)
        self.seq = 0                 # collectives called on this group so far, the same on every member in step
        self.completed = 0           # of those, the ones that returned (or raised in step on every member)
        self.device_transport = None   # made by the first collective on a cupy array (see transport_for)
        self.levels = levels         # (within a host, across hosts) for the hierarchical all-reduce, or None
        self.destroyed = False       # by destroy(): its communicators are freed
        runtime.groups.append(self)

    def rank(self) -> int:
        """This process's rank in the group, 0..size()-1."""
        return self.transport.rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self.transport.size

    def where(self) -> str:
        """This rank as messages name it: ``rank 2`` (the world), ``rank 2 in group [0, 2]``."""
        me = f"rank {self.ranks[self.transport.rank]}"
        return f"{me} in {self.label}" if self.label else me

    def transports(self) -> list:
        """Every transport of this group's calls (host, levels, device)."""
        found = [self.transport, *(self.levels or ())]
        return found + ([self.device_transport] if self.device_transport is not None else [])

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what this group's transports still have posted."""
        for transport in [self.transport, *(self.levels or ())]:
            transport.abandon()

    def release(self) -> None:
        """Free this group's communicators (every member does it in the same call: see ``destroy``)."""
        self.destroyed = True
        self.runtime.groups.remove(self)
        for transport in reversed(self.transports()):
            transport.close()

    def transport_for(self, x) -> Transport:
        """The transport that carries ``x``: MPI for numpy arrays; for cupy arrays the device
        transport, made on first use (every member must be in this call: collectives agree first)."""
        if isinstance(x, np.ndarray):
            return self.transport
        self.open_device_transport(x.device.id)
        return self.device_transport

    def open_device_transport(self, device: int | None) -> int:
        """Make the transport for cupy arrays on GPU ``device`` (None: GPU ``local_rank % visible
        GPUs``), made current, unless it exists (then ``device`` must be its GPU); return the GPU's
        index. Every member must make it together, as the first collective on a cupy array does
        (see ``ring.transport.device``)."""
        if self.device_transport is None:
            try:
                self.device_transport = device_transports.open_transport(self.transport, device,
                                                                         self.runtime.gpu_transport)
            except device_transports.Unavailable as e:   # the same on every member: still in step
                setting = " (COLLECTIVES_GPU_TRANSPORT=nccl)" if self.runtime.gpu_transport == "nccl" else ""
                raise CollectiveError(f"{e}{setting}") from e
        elif device is not None and device != self.device_transport.gpu:
            raise CollectiveError(f"{self.where()}: an array on GPU {device}, but this rank's collectives "
                                  f"run on GPU {self.device_transport.gpu} (one GPU per rank)")
        return self.device_transport.gpu

    def __repr__(self) -> str:
        name = "the world" if self.is_world else self.label
        return f"<Group {name}: rank {self.rank()} of {self.size()}>"

    # The collectives, as methods: each is the module-level one with group=self.

    def allreduce(self, x, op: str = "sum", out=None, **options) -> Any:
        """``collectives.allreduce`` on this group."""
        return _api().allreduce(x, op, out, group=self, **options)

    def allreduce_many(self, arrays: list, op: str = "sum", **options) -> Any:
        """``collectives.allreduce_many`` on this group."""
        return _api().allreduce_many(arrays, op, group=self, **options)

    def reduce_scatter(self, x, op: str = "sum", out=None, **options) -> Any:
        """``collectives.reduce_scatter`` on this group (blocks split across its ranks)."""
        return _api().reduce_scatter(x, op, out, group=self, **options)

    def allgather(self, x, out=None, **options) -> Any:
        """``collectives.allgather`` on this group (its ranks' arrays, in group order)."""
        return _api().allgather(x, out, group=self, **options)

    def broadcast(self, x, root: int = 0, **options) -> Any:
        """``collectives.broadcast`` on this group; ``root`` is a rank of the group."""
        return _api().broadcast(x, root, group=self, **options)

    def barrier(self, **options) -> Any:
        """``collectives.barrier`` on this group."""
        return _api().barrier(group=self, **options)

    def split(self, color: int | None, key: int = 0, **options) -> "Group | NonMember":
        """``collectives.split`` of this group: every member calls it."""
        return _api().split(color, key, group=self, **options)

    def new_group(self, ranks, **options) -> "Group | NonMember":
        """``collectives.new_group`` of this group's members (``ranks`` are world ranks)."""
        return _api().new_group(ranks, group=self, **options)

    def destroy(self, **options) -> None:
        """``collectives.destroy`` of this group: every member calls it; the group is unusable after."""
        return _api().destroy(group=self, **options)


class NonMember:
    """What ``new_group`` (and ``split`` with ``color=None``) return on the ranks left out: falsy,
    with the group's ``ranks``; ``rank()`` is -1, and any collective on it raises
    CollectiveUsageError on this rank.

    >>> g = NonMember((0, 1), 3)
    >>> bool(g), g.rank(), g.ranks
    (False, -1, (0, 1))
    """

    def __init__(self, ranks: tuple[int, ...], world_rank: int):
        self.ranks = tuple(ranks)
        self.world_rank = world_rank

    def __bool__(self) -> bool:
        return False

    def rank(self) -> int:
        return -1

    def size(self) -> int:
        return len(self.ranks)

    def refusal(self, collective: str) -> CollectiveUsageError:
        members = describe(self.ranks) if self.ranks else "a split group (color=None)"
        return CollectiveUsageError(f"{collective}: group: rank {self.world_rank} is not a member of {members}; "
                                    "the group was made without it (check `if group:` before using it)")

    def __getattr__(self, name: str):
        if name in _COLLECTIVE_METHODS:
            def refuse(*args, **kwargs):
                raise self.refusal(name)
            return refuse
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<NonMember of {describe(self.ranks)}: rank {self.world_rank} is not in it>"


_COLLECTIVE_METHODS = frozenset(("allreduce", "allreduce_many", "reduce_scatter", "allgather", "broadcast",
                                 "barrier", "split", "new_group", "destroy"))


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


def _api():
    from collectives import api   # (api builds on this module: imported when first called)
    return api
