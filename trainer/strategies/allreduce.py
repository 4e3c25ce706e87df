"""The all-reduce strategy: synchronous data parallelism. Every rank holds the whole model (or its
tensor-parallel part); each step its gradients are averaged across the replicas by all-reduce,
in buckets launched as backward produces them (``trainer.buckets``), and every rank applies the
same update. Its twin is ``trainer.strategies.ps`` (parameter servers). Its loop also runs local
SGD and DiLoCo (``trainer.strategies.periodic``: local steps, and a sync every H)."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import collectives as col
from cmdline import interrupt
from cmdline.parser import FAULT
from trainer.buckets import GradientBuckets
from trainer.common import EpochLog, Interrupted, UsageExit, epoch_record, save_checkpoint, say, \
    steps_per_epoch, stop_requested
from trainer.compression import ErrorFeedback
from trainer.layout import Layout, make_layout
from trainer.model import MLP
from trainer.optim import SGD
from trainer.shards import VirtualShards
from trainer.strategies.periodic import Periodic


@dataclass
class Loop:
    """What the steps of a run use: fixed for the run, but for ``layout`` (remade after a change of
    the world) and ``saved`` (the global step of the newest checkpoint; None or 0: none yet)."""
    args: Any
    dataset: Any
    config: dict
    model: MLP
    opt: SGD
    log: EpochLog
    layout: Layout
    saved: int | None = None
    periodic: Periodic | None = None   # local SGD or DiLoCo: local steps, a sync every H (None: all-reduce each step)
    feedback: ErrorFeedback | None = None   # --compression: this rank's gradient residual (None: uncompressed)
    buckets: GradientBuckets | None = None
    shards: VirtualShards | None = None   # --reproducible: this rank's virtual shards of each batch

    def __post_init__(self):
        self.shards = VirtualShards(self.args.shards) if self.args.reproducible else None

    def residual(self):
        """This rank's error-feedback residual, which checkpoints keep (None: no compression)."""
        return self.feedback.residual if self.feedback is not None else \
            self.periodic.residual() if self.periodic is not None else None

    def save(self, epoch: int, step: int, partial: bool = False) -> None:
        """Every rank: a checkpoint of the model as it stands (``common.save_checkpoint``), with the
        strategy's own arrays, the ranks' residuals, and with ``--inner-state local`` every rank's
        momentum (``trainer.resuming.inner_momentum``: what a resume gives back)."""
        extras = self.periodic.arrays() if self.periodic is not None else {}
        if self.periodic is not None and self.periodic.inner_state == "local":
            # every replica's own momentum, one row per rank: save_checkpoint's gather over the
            # tensor-parallel group passes it as it is (--inner-state local refuses tensor parallelism)
            extras = {**extras, "inner_velocities": col.allgather(self.opt.velocity[None, :])}
        save_checkpoint(self.args, self.model, self.opt, epoch, step, self.config, partial, extras, self.residual())


def train(args, dataset, config: dict, model: MLP, opt: SGD, start: int, step: int, log: EpochLog,
          layout: Layout, periodic: Periodic | None = None, feedback: ErrorFeedback | None = None) -> list[dict]:
    """Epochs ``start``..``args.epochs`` of synchronous data-parallel training, from global step
    ``step`` (a checkpoint written by ``--max-steps`` may leave off inside epoch ``start``);
    returns their records (as ``ps.train``). Ends by checking that every rank holds the very same
    parameters. Ctrl-C or SIGTERM on any rank stops every rank before the same step (``Interrupted``);
    after SIGTERM (a preemption) rank 0 first writes a checkpoint of that step, with --checkpoint-dir.
    With ``periodic`` (local SGD, DiLoCo) each step is a replica's own and the replicas meet every
    ``--sync-every`` steps; what a stop writes is then the last sync. ``feedback``: the gradients go
    compressed (--compression), with this rank's residual."""
    if periodic is not None:
        periodic.mark(model, opt, step)   # (the start, or a checkpoint, is a sync point)
    state = training_state(args, dataset, model, opt, start, step, periodic=periodic)
    loop = Loop(args, dataset, config, model, opt, log, layout, step if args.resume else None, periodic, feedback)
    return run_epochs(loop, state)


def train_elastic(args, dataset, config: dict, model: MLP, opt: SGD, begin: Callable[[], tuple[int, int]],
                  log: EpochLog, layout: Layout, periodic: Periodic | None = None,
                  feedback: ErrorFeedback | None = None) -> list[dict]:
    """``train`` under ``--elastic``: what a step changes is a ``col.elastic.State``, committed
    every ``--commit-every`` steps and at each epoch's end (with ``periodic``: at each sync); when
    a rank dies the survivors go on from the last commit in a world of their own, and ranks that
    ``--host-discovery`` finds join at a commit (``col.elastic.run``). ``begin()`` (the start's
    collectives: rank 0's model or checkpoint, returning the epoch and step to start at) runs
    inside, once: a death there is a change like any other, and a newcomer, which takes the state
    from rank 0, never runs it. The residuals of compression are each rank's own, not the state's:
    a change clears them (the rounding lost in at most one step)."""
    state = training_state(args, dataset, model, opt, 0, 0, begun=False, periodic=periodic)
    loop = Loop(args, dataset, config, model, opt, log, layout, None, periodic, feedback)

    def remake_layout(state: col.elastic.State, change: col.elastic.Change) -> None:
        loop.layout = make_layout(args.tensor_parallel)   # (the groups of the world before raise
        log.reopen()                                       # MembershipChanged; rank 0 may be another process)
        if periodic is not None:
            periodic.mark(model, opt, state.step)   # (the commit rolled back to is a sync)
        residual = loop.residual()
        if residual is not None:
            residual[...] = 0
        if loop.shards is not None and loop.shards.count % col.size():
            say(f"--reproducible: {col.size()} rank(s) take unequal parts of the {loop.shards.count} shards of each "
                "batch from here (the sums, and so the parameters, are the same)")

    def epochs(state: col.elastic.State) -> list[dict]:
        if not state.begun:
            start, step = begin()
            if periodic is not None:
                periodic.mark(model, opt, step)   # (the start, or a checkpoint, is a sync point)
            state.epoch, state.step, state.first = start, step, first_sample(args, dataset, start, step)
            loop.saved, state.begun = step if args.resume else None, True
            state.commit()
        return run_epochs(loop, state)

    state.on_change(remake_layout)
    return col.elastic.run(epochs, state, min_ranks=args.min_ranks, max_ranks=args.max_ranks,
                           host_discovery=args.host_discovery)


def training_state(args, dataset, model: MLP, opt: SGD, start: int, step: int, begun: bool = True,
                   periodic: Periodic | None = None) -> col.elastic.State:
    """What a step changes: the parameters and momentum (in place; with ``periodic``, its arrays
    too: DiLoCo's outer momentum), where the run stands (epoch, global step, first sample of the
    epoch's order) and the epoch's running sums."""
    return col.elastic.State(params=model.flat_params, velocity=opt.velocity, epoch=start, step=step,
                             first=first_sample(args, dataset, start, step), loss_sum=0.0, comm_s=0.0,
                             exposed_s=0.0, elapsed_s=0.0, steps=0, history=[], begun=begun,
                             **(periodic.arrays() if periodic is not None else {}))


def first_sample(args, dataset, epoch: int, step: int) -> int:
    """Where global step ``step`` starts in epoch ``epoch``'s order of samples."""
    return (step - epoch * steps_per_epoch(dataset, args.batch_size)) * args.batch_size


def run_epochs(loop: Loop, state) -> list[dict]:
    args = loop.args
    overlap = not args.no_overlap and loop.periodic is None and loop.shards is None
    loop.buckets = GradientBuckets(loop.model, args.bucket_mb * 1e6, loop.layout.dp, loop.feedback) if overlap \
        else None
    while state.epoch < args.epochs:
        if run_epoch(loop, state):
            break   # (--max-steps)
    check_replicas(loop.model)
    return state.history


def run_epoch(loop: Loop, state) -> bool:
    """The rest of epoch ``state.epoch`` from sample ``state.first`` of its order, then its record
    and checkpoint. Returns whether the run stopped at ``--max-steps`` instead (with a checkpoint
    of that step, or of the last sync)."""
    args, dataset, layout = loop.args, loop.dataset, loop.layout
    n_train = len(dataset.train_y)
    order = np.random.default_rng([args.seed, state.epoch]).permutation(n_train)
    while state.first < n_train:
        if stopping(loop, state):
            return True
        began = time.perf_counter()
        batch = order[state.first: state.first + args.batch_size]
        if loop.shards is not None:
            mine = [(dataset.train_x[s], dataset.train_y[s]) for s in loop.shards.mine(batch, layout.dp_size,
                                                                                          layout.dp_rank)]
            step(loop, state, mine, None, len(batch))
        else:
            shard = loop.model.xp.asarray(np.array_split(batch, layout.dp_size)[layout.dp_rank])
            step(loop, state, dataset.train_x[shard], dataset.train_y[shard], len(batch))
        state.elapsed_s += time.perf_counter() - began   # (in the state: a change keeps the epoch's time so far)
    end_epoch(loop, state)
    return False


def step(loop: Loop, state, x, y, batch: int) -> None:
    """One global step of ``batch`` samples (this rank's shard ``x``, ``y``; with --reproducible,
    ``x`` lists its virtual shards' (x, y)), and what follows it: the sync that is due
    (``periodic``), the commit (``--elastic``)."""
    args, model, opt, layout, periodic = loop.args, loop.model, loop.opt, loop.layout, loop.periodic
    if loop.shards is not None:
        loss, in_flight, exposed = loop.shards.train_step(model, opt, x, batch, layout.dp)
    elif periodic is None:
        loss, in_flight, exposed = train_step(model, opt, loop.buckets, x, y, 1.0 / batch, layout.dp, loop.feedback)
    else:
        loss, in_flight, exposed = periodic.local_step(model, opt, x, y, layout.dp_size / batch), 0.0, 0.0
    state.loss_sum, state.steps, state.step = state.loss_sum + loss, state.steps + 1, state.step + 1
    state.first += batch
    if periodic is not None and periodic.due(state.step):
        in_flight = exposed = periodic.sync(model, opt, state.step, layout.dp)
    state.comm_s, state.exposed_s = state.comm_s + in_flight, state.exposed_s + exposed
    if args.elastic and (state.step % args.commit_every == 0 if periodic is None else periodic.due(state.step)):
        state.commit()


def stopping(loop: Loop, state) -> bool:
    """Before each step: Ctrl-C or SIGTERM on any rank (raise ``Interrupted`` on every rank; after
    SIGTERM, first a checkpoint), or ``--max-steps`` reached (a checkpoint; True). Local SGD and
    DiLoCo go back to the last sync first: between syncs the replicas differ, and a resumed run
    must replay the uninterrupted one's steps from a state every replica holds. A stop at an
    epoch's end (or rolled back to one) is that epoch's checkpoint, written only if it was not."""
    args, model, per_epoch = loop.args, loop.model, steps_per_epoch(loop.dataset, loop.args.batch_size)
    asked = stop_requested()
    at_max = not asked and args.max_steps is not None and state.step >= args.max_steps
    if not asked and not at_max:
        return False
    kept = state.step
    if at_max or asked == interrupt.PREEMPTED:   # (at once: the batch system's grace is short)
        kept = loop.periodic.roll_back(model, loop.opt) if loop.periodic is not None else state.step
        if args.checkpoint_dir and kept not in (0, loop.saved):   # (step 0 is --seed's: nothing to keep)
            loop.save(kept // per_epoch - 1, kept, partial=kept % per_epoch != 0)
            loop.saved = kept
    if asked:
        where = f"epoch {state.epoch + 1}, step {state.first // args.batch_size + 1} of {per_epoch}"
        saved = covered(loop.saved, per_epoch, loop.periodic is not None) if loop.saved else None
        raise Interrupted(where, saved, args.checkpoint_dir, preempted=asked == interrupt.PREEMPTED)
    if state.step > args.max_steps:   # (a resume from beyond it: this run took no step)
        say(f"stopped at step {state.step}, where the run resumed: --max-steps {args.max_steps} was already past")
    else:
        say(f"stopped at step {state.step} (--max-steps)" +
            (f"; back at the last sync, step {kept}" if kept != state.step else ""))
    return True


def covered(step: int, per_epoch: int, synced: bool) -> str:
    """What a checkpoint of global ``step`` covers, as rank 0 names it: an epoch, or a step inside
    the next one (``synced``: local SGD's or DiLoCo's, whose checkpoints are all of a sync).

    >>> covered(46, 23, False), covered(50, 23, False), covered(50, 23, True)
    ('epoch 2', 'step 50 (inside epoch 3)', 'step 50 (inside epoch 3, the last sync)')
    """
    epochs, into = divmod(step, per_epoch)
    if not into:
        return f"epoch {epochs}"
    return f"step {step} (inside epoch {epochs + 1}{', the last sync' if synced else ''})"


def end_epoch(loop: Loop, state) -> None:
    """The epoch's record (the loss summed over the replicas, the model scored), its checkpoint, and
    the state set at the next epoch's start (committed, under ``--elastic``)."""
    args, layout, epoch = loop.args, loop.layout, state.epoch
    elapsed, steps = state.elapsed_s, max(state.steps, 1)
    loss = float(col.allreduce(np.array([state.loss_sum]), group=layout.dp)[0]) / len(loop.dataset.train_y)
    record = {**epoch_record(epoch, state.step, loss, loop.model, loop.dataset, layout, elapsed, steps, state.comm_s,
                             state.exposed_s, str(layout)), "dp": layout.dp_size, "tp": layout.tp_size}
    if loop.periodic is not None:
        record.update(strategy=loop.periodic.name, sync_every=loop.periodic.every)
    state.history = state.history + [record]
    loop.log.write(record)
    if args.checkpoint_dir and ((epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.epochs):
        loop.save(epoch, state.step)
        loop.saved = state.step
    state.epoch, state.first, state.loss_sum, state.comm_s, state.exposed_s, state.elapsed_s, state.steps = \
        epoch + 1, 0, 0.0, 0.0, 0.0, 0.0, 0
    if args.elastic:
        state.commit()


def train_step(model: MLP, opt: SGD, buckets: GradientBuckets | None, x, y, scale: float,
               dp: col.Group | None = None, feedback: ErrorFeedback | None = None) -> tuple[float, float, float]:
    """One step: gradients, averaged across the replicas (the ranks of ``dp``; None: the world), then
    the update. Returns the loss sum of this rank's shard, the seconds gradients were being
    all-reduced, and the seconds the step waited for that (exposed). With ``buckets``, each bucket's all-reduce runs while backward goes on;
    without, one all-reduce of the whole flat buffer follows backward (nothing hidden), compressed
    with ``feedback`` (which the buckets hold themselves)."""
    if buckets is not None:
        loss = model.loss_and_grads(x, y, scale, layer_done=buckets.layer_done)
        with col.timeline.span("wait for gradients"):
            in_flight, exposed = buckets.wait()
    else:
        loss = model.loss_and_grads(x, y, scale)
        col.synchronize(model.flat_grads)   # (on a GPU: so that the time below is the all-reduce's own)
        began = time.perf_counter()
        if feedback is not None:
            feedback.contribute(model.flat_grads)
        col.allreduce(model.flat_grads, op="sum", out=model.flat_grads, group=dp, **compressed(feedback))
        col.synchronize(model.flat_grads)
        in_flight = exposed = time.perf_counter() - began
    with col.timeline.span("optimizer step"):
        opt.step(model.flat_grads)
    return loss, in_flight, exposed


def compressed(feedback: ErrorFeedback | None) -> dict:
    """The keyword of a compressed all-reduce (none without ``feedback``: the call stays as it was).

    >>> compressed(None)
    {}
    """
    return {"compression": feedback.codec} if feedback is not None else {}


def check_replicas(model: MLP) -> None:
    """Every rank must end with the very same parameters (the all-reduce gives every rank the same
    bits): compare a digest of each rank's (of the whole model, gathered over the tensor-parallel
    group), and stop with an error naming the ranks that differ."""
    digest = hashlib.blake2b(col.to_host(model.to_full(model.flat_params)).tobytes(), digest_size=8).digest()
    every = col.allgather(np.frombuffer(digest, np.uint8)[None, :])
    differing = [r for r in range(len(every)) if not np.array_equal(every[r], every[0])]
    if differing:
        raise UsageExit(f"the parameters of rank(s) {differing} differ from rank 0's after training", FAULT)
    say(f"parameters identical on every rank (blake2b {digest.hex()})")

