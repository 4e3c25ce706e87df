"""How the ranks share the work: data parallel across model replicas, tensor parallel within one.

With n ranks and ``--tensor-parallel T``, consecutive blocks of T ranks each hold one replica
of the model, split across them (``trainer.model.MLP`` with ``tp``); the n/T replicas each
train on their share of the global batch and average their gradients with the ranks that
hold the same part in the other replicas. n = 4, T = 2::

    world rank          0    1    2    3
    replica (dp rank)   0    0    1    1      the batch is split in 2 shards
    part (tp rank)      0    1    0    1      each layer pair is split in 2
    tp groups           [0, 1]    [2, 3]      sum activations and their gradients
    dp groups           [0, 2] and [1, 3]     average gradients
"""
from __future__ import annotations

from dataclasses import dataclass

import collectives as col


@dataclass
class Layout:
    """This rank's place: ``tp`` and ``dp`` are its groups (None: not split that way, the world
    for dp); ``dp_rank``/``dp_size`` say which share of each batch its replica takes."""
    tp: col.Group | None
    dp: col.Group | None
    dp_rank: int
    dp_size: int

    @property
    def tp_size(self) -> int:
        return self.tp.size() if self.tp is not None else 1

    def __str__(self) -> str:
        return f"{self.dp_size} x {self.tp_size} (dp x tp)"


def make_layout(tensor_parallel: int) -> Layout:
    """Every rank together: the groups of ``tensor_parallel`` consecutive ranks, and across them.
    ``col.size()`` must be a multiple of ``tensor_parallel`` (the caller checks)."""
    if tensor_parallel == 1:
        return Layout(None, None, col.rank(), col.size())
    tp = col.split(col.rank() // tensor_parallel)
    dp = col.split(col.rank() % tensor_parallel)
    return Layout(tp, dp, dp.rank(), dp.size())
