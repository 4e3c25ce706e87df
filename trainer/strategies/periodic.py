"""What local SGD (``trainer.strategies.local_sgd``) and DiLoCo (``trainer.strategies.diloco``) share:
replicas that step alone and meet every ``--sync-every H`` steps. The loop is the all-reduce
strategy's (``trainer.strategies.allreduce``), which asks this helper for each local step, whether
a sync is due, and what to write or roll back to; each strategy says only how the replicas meet
(``combine``).

The schedule: a sync after every H-th step of an epoch and after the epoch's last step, so that
every epoch ends at a sync (its record scores a model every rank holds, its checkpoint is a sync
point) and the schedule is a function of the global step alone: a run resumed from any sync, on
any number of ranks, meets where an uninterrupted one does. With 23 steps an epoch and H = 10,
the syncs follow steps 10, 20, 23, 33, 43, 46, ...

What the replicas do with their inner optimizer's momentum at a sync is ``--inner-state``'s:

- ``averaged`` (the default): it is averaged too, in the same fused call as the parameters (local
  SGD) or the delta (DiLoCo, without compression). After a sync every replica holds the very same
  state, so a sync point is the whole state of the run: any number of ranks resumes its checkpoint,
  an elastic commit needs nothing per rank. It doubles the bytes of a sync: 2/H of what the
  all-reduce strategy sends in H steps.
- ``local`` (the DiLoCo paper's): each replica keeps its own, and a sync sends the parameters or
  the delta alone, 1/H. The replicas' momenta then differ, so a checkpoint holds every rank's
  (``inner_velocities``, one row per rank, besides rank 0's as ``velocity``): a resume on as many
  ranks gives each its own back (the bits of the uninterrupted run); on another number, every rank
  starts from their average, which no uninterrupted run holds. Refused with ``--elastic`` (a change
  hands every rank rank 0's state) and with ``--tensor-parallel`` above 1.

A checkpoint (every epoch's end), an elastic commit, and the checkpoint that a preemption or
``--max-steps`` writes are all of the last sync; a stop between syncs rolls the model back to it
(at most H - 1 steps are done again by the resumed run), which keeps a resumed run on the
uninterrupted one's bits.
"""
from __future__ import annotations

import time

import collectives as col
from trainer.model import MLP
from trainer.optim import SGD


#: --inner-state's choices: what a sync does with the inner optimizer's momentum.
INNER_STATES = ("averaged", "local")


class Periodic:
    """A replica's local steps and the state of the last sync (its parameters and momentum, and the
    global step it followed). Subclasses define ``combine``.

    >>> import numpy as np
    >>> model = MLP([4, 3], np.random.default_rng(0), np.float64)
    >>> p = Periodic(model, SGD(model.flat_params, 0.1, 0.0, 0.0), every=10, per_epoch=23)
    >>> [step for step in range(1, 50) if p.due(step)]
    [10, 20, 23, 33, 43, 46]
    """

    #: --strategy's name (subclasses).
    name = ""

    def __init__(self, model: MLP, opt: SGD, every: int, per_epoch: int, inner_state: str = "averaged"):
        if inner_state not in INNER_STATES:
            raise ValueError(f"inner_state: one of {', '.join(INNER_STATES)}, got {inner_state!r}")
        self.every, self.per_epoch, self.inner_state = every, per_epoch, inner_state
        self.synced_params = model.flat_params.copy()    # (DiLoCo's anchor: the outer step starts here)
        self.synced_velocity = opt.velocity.copy()
        self.synced_step = 0

    def due(self, step: int) -> bool:
        """Whether the replicas meet once ``step`` global steps are done: after every ``every``-th
        step of an epoch, and after its last."""
        return step % self.per_epoch % self.every == 0

    def local_step(self, model: MLP, opt: SGD, x, y, scale: float) -> float:
        """One optimizer step on this replica's shard alone; returns its loss sum. ``scale`` is the
        replicas' count over the global batch (the shard's mean when shards are equal): the average
        of the replicas' steps then weighs each sample of the global batch alike, as the all-reduce
        strategy's one step does, so that with H = 1 the two are the same training."""
        loss = model.loss_and_grads(x, y, scale)
        with col.timeline.span("optimizer step"):
            opt.step(model.flat_grads)
        return loss

    def sync(self, model: MLP, opt: SGD, step: int, group: col.Group | None) -> float:
        """The replicas (the ranks of ``group``; None: the world) meet after global step ``step``;
        returns the seconds it took (all of it communication nothing hides)."""
        col.synchronize(model.flat_params)
        began = time.perf_counter()
        with col.timeline.span(f"{self.name} sync"):
            self.combine(model, opt, group)
            col.synchronize(model.flat_params)
        seconds = time.perf_counter() - began
        self.mark(model, opt, step)
        return seconds

    def combine(self, model: MLP, opt: SGD, group: col.Group | None) -> None:
        """Make every replica's parameters (and, with averaged inner state, momentum) the same (each
        strategy's own arithmetic)."""
        raise NotImplementedError

    def averaged_state(self, opt: SGD) -> list:
        """The inner optimizer's arrays that a sync averages besides the parameters or delta: the
        momentum with ``--inner-state averaged``, nothing with ``local``."""
        return [opt.velocity] if self.inner_state == "averaged" else []

    def mark(self, model: MLP, opt: SGD, step: int) -> None:
        """The model is at a sync point after global step ``step`` (after a sync, the start, a resume,
        a change of the world): keep it as the state to roll back to."""
        self.synced_params[...] = model.flat_params
        self.synced_velocity[...] = opt.velocity
        self.synced_step = step

    def roll_back(self, model: MLP, opt: SGD) -> int:
        """Put the last sync's state back into the model and optimizer (the run stops between two
        syncs, and writes this); returns the global step it followed."""
        model.flat_params[...] = self.synced_params
        opt.velocity[...] = self.synced_velocity
        return self.synced_step

    def arrays(self) -> dict:
        """What the checkpoint holds beyond the parameters and momentum, laid out like the
        parameters (name -> this rank's array; DiLoCo's outer momentum)."""
        return {}

    def residual(self):
        """The error-feedback residual of what this strategy all-reduces compressed (None: nothing)."""
        return None
