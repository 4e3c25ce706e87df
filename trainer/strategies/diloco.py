"""DiLoCo (``--strategy diloco --sync-every H [--outer-lr LR] [--outer-momentum M]``; Douillard et
al., "DiLoCo: Distributed Low-Communication Training of Language Models", 2023): each replica takes
H inner steps alone (the trainer's SGD with momentum, here where the paper uses AdamW), then the
replicas average their deltas (the parameters at the last sync minus their own now: an "outer
gradient") and an outer optimizer, SGD with Nesterov momentum, steps from the last sync's
parameters with that average. The paper's outer lr 0.7 and momentum 0.9 were tuned for language
models (AdamW inside, H = 500). Here, with SGD and momentum inside and H of 8 to 32, that
momentum makes each outer step about 7 times the average delta: two points lost on the digits,
and a divergence on --dataset synthetic. The defaults are lr 0.5 and momentum 0.5, within a point
of the all-reduce on both data sets (docs/slow-links.md).

The outer step, on every rank alike (``d`` the averaged delta, ``b`` the outer momentum, ``p`` the
last sync's parameters; torch.optim.SGD's Nesterov form)::

    b = M * b + d
    p = p - LR * (d + M * b)

With LR = 1 and M = 0 the outer step lands on the average of the replicas' parameters: local SGD,
up to rounding. The outer momentum is part of the checkpoint and of the elastic state. With
``--compression`` the delta is all-reduced compressed, with error feedback (``trainer.compression``:
each rank's residual is carried to its next sync); the inner momentum, averaged at every sync as
local SGD averages it unless ``--inner-state local`` keeps it on each replica as the paper does
(``trainer.strategies.periodic``), is sent whole.
"""
from __future__ import annotations

import collectives as col
from trainer.compression import ErrorFeedback
from trainer.model import MLP
from trainer.optim import SGD
from trainer.strategies.periodic import Periodic


class DiLoCo(Periodic):
    """The outer optimizer: its momentum, and the last sync's parameters it steps from
    (``synced_params``, which ``outer_step`` moves).

    >>> import numpy as np
    >>> model = MLP([2, 2], np.random.default_rng(0), np.float64)
    >>> outer = DiLoCo(model, SGD(model.flat_params, 0.1, 0.0, 0.0), every=4, per_epoch=23)
    >>> outer.lr, outer.momentum, outer.outer_momentum.shape, outer.feedback is None
    (0.5, 0.5, (6,), True)
    """

    name = "diloco"

    def __init__(self, model: MLP, opt: SGD, every: int, per_epoch: int, lr: float = 0.5, momentum: float = 0.5,
                 compression: str = "none", inner_state: str = "averaged"):
        super().__init__(model, opt, every, per_epoch, inner_state)
        self.lr, self.momentum = lr, momentum
        self.outer_momentum = model.flat_params * 0
        self.compression = compression
        self.feedback = ErrorFeedback(model.flat_params, compression) if compression != "none" else None

    def combine(self, model: MLP, opt: SGD, group: col.Group | None) -> None:
        """The averaged delta, then the outer step; every rank computes the same bits from the same inputs."""
        delta = model.flat_params   # (made in the parameters' buffer: this replica's own are not needed after)
        model.xp.subtract(self.synced_params, delta, out=delta)
        if self.feedback is None:
            col.allreduce_many([delta, *self.averaged_state(opt)], op="avg", group=group, name="diloco sync")
        else:
            self.feedback.contribute(delta)
            works = [col.allreduce(delta, op="avg", out=delta, group=group, async_op=True, name="diloco delta",
                                   compression=self.compression)]
            works += [col.allreduce(state, op="avg", out=state, group=group, async_op=True, name="diloco momentum")
                      for state in self.averaged_state(opt)]
            for work in works:
                work.wait()
        self.outer_step(delta, model.flat_params)

    def outer_step(self, delta, out) -> None:
        """``out`` = the last sync's parameters after the outer step on the averaged ``delta``
        (which this overwrites; ``out`` may be ``delta`` itself).

        >>> import numpy as np
        >>> model = MLP([2, 2], np.random.default_rng(0), np.float64)
        >>> outer = DiLoCo(model, SGD(model.flat_params, 0.1, 0.0, 0.0), 4, 23, lr=0.5, momentum=0.5)
        >>> out = np.empty(6); outer.outer_step(np.ones(6), out)   # b = 1; 0.5 * (1 + 0.5 * 1)
        >>> out - model.flat_params
        array([-0.75, -0.75, -0.75, -0.75, -0.75, -0.75])
        """
        self.outer_momentum *= self.momentum
        self.outer_momentum += delta
        delta += self.momentum * self.outer_momentum   # (Nesterov: the step looks one momentum ahead)
        self.synced_params -= self.lr * delta
        out[...] = self.synced_params

    def arrays(self) -> dict:
        return {"outer_momentum": self.outer_momentum}

    def residual(self):
        return self.feedback.residual if self.feedback is not None else None
