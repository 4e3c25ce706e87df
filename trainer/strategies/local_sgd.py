"""Local SGD (``--strategy local-sgd --sync-every H``): each replica takes H optimizer steps on its
own shard of each global batch without communicating, then the replicas average their parameters
(and their momentum, unless ``--inner-state local``): one all-reduce every H steps instead of one
every step.

With H = 1 it is the all-reduce strategy's training, in exact arithmetic: the average of n
momentum steps from the same parameters is the momentum step on the average gradient (every term
is linear), and each replica's gradient is scaled so that their average is the global batch's
mean (``Periodic.local_step``). In floating point the two round differently (float64 after 3
epochs on the digits: within 1e-9; one rank: the same bits, the average of one replica being
itself). With H > 1 the replicas drift apart between syncs, which costs accuracy as H grows (Lin
et al., "Don't use large mini-batches, use local SGD"; Stich, "Local SGD converges fast and
communicates little"). The schedule, and what a checkpoint holds: ``trainer.strategies.periodic``.
"""
from __future__ import annotations

import collectives as col
from trainer.model import MLP
from trainer.optim import SGD
from trainer.strategies.periodic import Periodic


class LocalSGD(Periodic):
    """Replicas that average their parameters (and momentum: ``inner_state``) every ``every`` steps.

    >>> import numpy as np
    >>> model = MLP([4, 3], np.random.default_rng(0), np.float64)
    >>> opt = SGD(model.flat_params, 0.1, 0.9, 0.0)
    >>> sgd = LocalSGD(model, opt, every=4, per_epoch=23)
    >>> model.flat_params += 1; sgd.mark(model, opt, 4); model.flat_params -= 1   # a sync after step 4, a step
    >>> sgd.roll_back(model, opt), bool((sgd.synced_params == model.flat_params).all())   # a stop before the next
    (4, True)
    """

    name = "local-sgd"

    def combine(self, model: MLP, opt: SGD, group: col.Group | None) -> None:
        """Average the parameters (and the momentum), in one fused all-reduce (the same bits on every rank)."""
        col.allreduce_many([model.flat_params, *self.averaged_state(opt)], op="avg", group=group,
                           name="local-sgd sync")
