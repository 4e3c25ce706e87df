"""The table of collectives: every call a ``Group`` makes, once, with the facts the rest of the
runtime asks of it. A new collective is its plan (``ring/schedule.py``, ``ring/personalized_schedule.py``),
its algorithm (``ring/algorithms.py``; a choice by size: ``ring.cost.ALGORITHMS``), its body
(``collectives/ops``), its ``Group`` method, and one entry here; ``tests/test_table.py`` keeps
every other list of names out of the code.

Who reads it: the module-level functions and the package's exports (``collectives.api``,
``collectives/__init__.py``: one each per entry), the refusals of a rank outside a group
(``collectives.groups.membership.NonMember``), the floating-point guard of the call's frame
(``REDUCING``), the cross-rank check's messages (``collectives.calls.signature``: ``shape``),
``algorithm_for`` and the bench (``SIZED``), the express lanes and the cost model's prices of them
(``LANED``). Programs read it as ``col.table``.
It lives on the floor of the calls (``collectives/calls``), the lowest that reads it, so every
reader imports downwards.

>>> [c.name for c in COLLECTIVES if c.reduces]
['allreduce', 'allreduce_many', 'reduce_scatter', 'reduce']
>>> SIZED                                             # chosen by size: ring.cost.ALGORITHMS
('allreduce', 'reduce_scatter', 'allgather', 'broadcast')
>>> LANED                                             # express lanes: collectives.ops.express
('allreduce', 'allgather', 'broadcast')
>>> sorted(CODECS)                                    # compression=: ring.compression.CODECS
['bf16', 'fp16']
"""
from __future__ import annotations

from typing import NamedTuple

from ring.compression import CODECS   # noqa: F401 - (the codecs: one entry each, their limits with them)
from ring.cost import ALGORITHMS


#: The shape a signature compares by default: ``x``'s whole shape, and its element count with it.
WHOLE_SHAPE = ("shape", "x")
_TRAILING = ("trailing shape", "x")   # (axis 0 may differ between ranks)


class Collective(NamedTuple):
    """One collective: its ``name`` (the ``Group`` method, the module-level function, the name in
    messages and signatures) and what the runtime must know of it without calling it.

    >>> Collective("reduce", reduces=True).sized, BY_NAME["allgather"].blocks, BY_NAME["allgather"].shape
    (False, True, ('trailing shape', 'x'))
    """
    name: str
    #: It combines values with ``op=``: the frame runs it under IEEE rules, with no warnings, the
    #: same on every rank (``ring.arrays.ieee_floating_point``); the bench gives it ``--redop``.
    reduces: bool = False
    #: Its data is one block per rank (of ``x`` or of the result): the bench's sizes split evenly.
    blocks: bool = False
    #: What the cross-rank check compares as its shape, and the argument that holds it, as its
    #: messages name them: ``x``'s whole shape (and its count), or what stands instead (the shape
    #: past axis 0 where axis 0 may differ between ranks; each array's; the new group's members).
    shape: tuple[str, str] = WHOLE_SHAPE
    #: A repeated blocking call of it on host arrays runs in an express lane (``collectives.ops.express``),
    #: which the cost model prices by ``ring.cost.LANES`` where every algorithm has one (two ranks).
    lanes: bool = False

    @property
    def sized(self) -> bool:
        """Whether the cost model chooses its algorithm by size (``algorithm=``, ``algorithm_for``)."""
        return self.name in ALGORITHMS


#: Every collective, in the order ``help(collectives)`` lists them.
COLLECTIVES: tuple[Collective, ...] = (
    Collective("allreduce", reduces=True, lanes=True),
    Collective("allreduce_many", reduces=True, shape=("dtype and shape of each array", "arrays")),
    Collective("reduce_scatter", reduces=True, blocks=True),
    Collective("allgather", blocks=True, shape=_TRAILING, lanes=True),
    Collective("broadcast", lanes=True),
    Collective("alltoall", blocks=True, shape=_TRAILING),
    Collective("gather", blocks=True, shape=_TRAILING),
    Collective("scatter", blocks=True),
    Collective("reduce", reduces=True),
    Collective("barrier"),
    Collective("refuse"),               # (a turn taken as a refusal: Group.refuse)
    Collective("new_group", shape=("members", "ranks")),   # making and freeing groups (collectives.groups.making)
    Collective("split"),
    Collective("destroy"),
    Collective("algorithm_for"),        # (local: what a call would run, no message)
)

BY_NAME: dict[str, Collective] = {c.name: c for c in COLLECTIVES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: The collectives that reduce: the frame's floating-point guard (``collectives.calls.call``).
REDUCING: frozenset[str] = frozenset(c.name for c in COLLECTIVES if c.reduces)
#: The collectives whose algorithm the cost model chooses by size, in the table's order.
SIZED: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.sized)
#: The collectives with express lanes, in the table's order.
LANED: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.lanes)


def compared_shape(collective: str) -> tuple[str, str]:
    """What the cross-rank check of ``collective`` compares as its shape, and its argument (see
    ``Collective.shape``); ``WHOLE_SHAPE`` for the calls that are not collectives of a group
    (``use_local_gpu``, ``nccl_communicator``).

    >>> compared_shape("new_group"), compared_shape("use_local_gpu")
    (('members', 'ranks'), ('shape', 'x'))
    """
    entry = BY_NAME.get(collective)
    return WHOLE_SHAPE if entry is None else entry.shape
