"""The all-reduce strategy: synchronous data parallelism. Every rank holds the whole model (or its
tensor-parallel part); each step its gradients are averaged across the replicas by all-reduce,
in buckets launched as backward produces them (``trainer.buckets``), and every rank applies the
same update. Its twin is ``trainer.strategies.ps`` (parameter servers)."""
from __future__ import annotations

import hashlib
import time
from typing import Callable

import numpy as np

import collectives as col
from cmdline import interrupt
from cmdline.parser import FAULT
from trainer.buckets import GradientBuckets
from trainer.common import EpochLog, Interrupted, UsageExit, epoch_record, save_checkpoint, say, \
    steps_per_epoch, stop_requested
from trainer.layout import Layout, make_layout
from trainer.model import MLP
from trainer.optim import SGD


def train(args, dataset, config: dict, model: MLP, opt: SGD, start: int, step: int, log: EpochLog,
          layout: Layout) -> list[dict]:
    """Epochs ``start``..``args.epochs`` of synchronous data-parallel training, from global step
    ``step`` (a checkpoint written by ``--max-steps`` may leave off inside epoch ``start``);
    returns their records (as ``ps.train``). Ends by checking that every rank holds the very same
    parameters. Ctrl-C or SIGTERM on any rank stops every rank before the same step (``Interrupted``);
    after SIGTERM (a preemption) rank 0 first writes a checkpoint of that step, with --checkpoint-dir."""
    state = training_state(args, dataset, model, opt, start, step)
    return run_epochs(args, dataset, config, model, opt, state, log, layout, {"saved": start if args.resume else None})


def train_elastic(args, dataset, config: dict, model: MLP, opt: SGD, begin: Callable[[], tuple[int, int]],
                  log: EpochLog, layout: Layout) -> list[dict]:
    """``train`` under ``--elastic``: what a step changes is a ``col.elastic.State``, committed
    every ``--commit-every`` steps and at each epoch's end; when a rank dies the survivors go on
    from the last commit in a world of their own, and ranks that ``--host-discovery`` finds join
    at a commit (``col.elastic.run``). ``begin()`` (the start's collectives: rank 0's model or
    checkpoint, returning the epoch and step to start at) runs inside, once: a death there is a
    change like any other, and a newcomer, which takes the state from rank 0, never runs it."""
    state = training_state(args, dataset, model, opt, 0, 0, begun=False)
    progress, current = {"saved": None}, {"layout": layout}   # (the newest checkpoint's epochs; this world's layout)

    def remake_layout(state: col.elastic.State, change: col.elastic.Change) -> None:
        current["layout"] = make_layout(args.tensor_parallel)   # (the groups of the world before raise
        log.reopen()                                             # MembershipChanged; rank 0 may be another process)

    def epochs(state: col.elastic.State) -> list[dict]:
        if not state.begun:
            start, step = begin()
            state.epoch, state.step, state.first = start, step, first_sample(args, dataset, start, step)
            progress["saved"], state.begun = start if args.resume else None, True
            state.commit()
        return run_epochs(args, dataset, config, model, opt, state, log, current["layout"], progress)

    state.on_change(remake_layout)
    return col.elastic.run(epochs, state, min_ranks=args.min_ranks, max_ranks=args.max_ranks,
                           host_discovery=args.host_discovery)


def training_state(args, dataset, model: MLP, opt: SGD, start: int, step: int, begun: bool = True) -> col.elastic.State:
    """What a step changes: the parameters and momentum (in place), where the run stands (epoch,
    global step, first sample of the epoch's order) and the epoch's running sums."""
    return col.elastic.State(params=model.flat_params, velocity=opt.velocity, epoch=start, step=step,
                             first=first_sample(args, dataset, start, step), loss_sum=0.0, comm_s=0.0,
                             exposed_s=0.0, elapsed_s=0.0, steps=0, history=[], begun=begun)


def first_sample(args, dataset, epoch: int, step: int) -> int:
    """Where global step ``step`` starts in epoch ``epoch``'s order of samples."""
    return (step - epoch * steps_per_epoch(dataset, args.batch_size)) * args.batch_size


def run_epochs(args, dataset, config: dict, model: MLP, opt: SGD, state, log: EpochLog, layout: Layout,
               progress: dict) -> list[dict]:
    buckets = None if args.no_overlap else GradientBuckets(model, args.bucket_mb * 1e6, layout.dp)
    while state.epoch < args.epochs:
        if run_epoch(args, dataset, config, model, opt, state, buckets, layout, log, progress):
            break   # (--max-steps)
    check_replicas(model)
    return state.history


def run_epoch(args, dataset, config: dict, model: MLP, opt: SGD, state, buckets, layout: Layout, log: EpochLog,
              progress: dict) -> bool:
    """The rest of epoch ``state.epoch`` from sample ``state.first`` of its order, then its record
    and checkpoint (``progress["saved"]``: the epochs the newest one covers). Returns whether the
    run stopped at ``--max-steps`` instead (with a checkpoint of that step)."""
    xp, n_train, epoch = model.xp, len(dataset.train_y), state.epoch
    order = np.random.default_rng([args.seed, epoch]).permutation(n_train)
    while state.first < n_train:
        asked = stop_requested()
        if asked:
            where = f"epoch {epoch + 1}, step {state.first // args.batch_size + 1} of " \
                    f"{steps_per_epoch(dataset, args.batch_size)}"
            saved = progress["saved"] and f"epoch {progress['saved']}"
            if asked == interrupt.PREEMPTED and args.checkpoint_dir:   # (at once: the batch system's grace is short)
                save_checkpoint(args, model, opt, epoch - 1, state.step, config, partial=True)
                saved = f"step {state.step} (inside epoch {epoch + 1})"
            raise Interrupted(where, saved, args.checkpoint_dir, preempted=asked == interrupt.PREEMPTED)
        if args.max_steps is not None and state.step >= args.max_steps:
            if args.checkpoint_dir:
                save_checkpoint(args, model, opt, epoch - 1, state.step, config, partial=True)
            say(f"stopped at step {state.step} (--max-steps)")
            return True
        began = time.perf_counter()
        batch = order[state.first: state.first + args.batch_size]
        shard = xp.asarray(np.array_split(batch, layout.dp_size)[layout.dp_rank])
        loss, in_flight, exposed = train_step(model, opt, buckets, dataset.train_x[shard],
                                              dataset.train_y[shard], 1.0 / len(batch), layout.dp)
        state.loss_sum, state.comm_s, state.exposed_s = state.loss_sum + loss, state.comm_s + in_flight, \
            state.exposed_s + exposed
        state.steps, state.step, state.first = state.steps + 1, state.step + 1, state.first + len(batch)
        if args.elastic and state.step % args.commit_every == 0:
            state.commit()
        state.elapsed_s += time.perf_counter() - began   # (in the state: a change keeps the epoch's time so far)
    elapsed, steps = state.elapsed_s, max(state.steps, 1)
    loss = float(col.allreduce(np.array([state.loss_sum]), group=layout.dp)[0]) / n_train
    record = {**epoch_record(epoch, state.step, loss, model, dataset, layout, elapsed, steps, state.comm_s,
                             state.exposed_s, str(layout)), "dp": layout.dp_size, "tp": layout.tp_size}
    state.history = state.history + [record]
    log.write(record)
    if args.checkpoint_dir and ((epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.epochs):
        save_checkpoint(args, model, opt, epoch, state.step, config)
        progress["saved"] = epoch + 1
    state.epoch, state.first, state.loss_sum, state.comm_s, state.exposed_s, state.elapsed_s, state.steps = \
        epoch + 1, 0, 0.0, 0.0, 0.0, 0.0, 0
    if args.elastic:
        state.commit()
    return False


def train_step(model: MLP, opt: SGD, buckets: GradientBuckets | None, x, y, scale: float,
               dp: col.Group | None = None) -> tuple[float, float, float]:
    """One step: gradients, averaged across the replicas (the ranks of ``dp``; None: the world), then
    the update. Returns the loss sum of this rank's shard, the seconds gradients were being
    all-reduced, and the seconds the step waited for that (exposed). With ``buckets``, each bucket's all-reduce runs while backward goes on;
    without, one all-reduce of the whole flat buffer follows backward (nothing hidden)."""
    if buckets is not None:
        loss = model.loss_and_grads(x, y, scale, layer_done=buckets.layer_done)
        with col.timeline.span("wait for gradients"):
            in_flight, exposed = buckets.wait()
    else:
        loss = model.loss_and_grads(x, y, scale)
        col.synchronize(model.flat_grads)   # (on a GPU: so that the time below is the all-reduce's own)
        began = time.perf_counter()
        col.allreduce(model.flat_grads, op="sum", out=model.flat_grads, group=dp)
        col.synchronize(model.flat_grads)
        in_flight = exposed = time.perf_counter() - began
    with col.timeline.span("optimizer step"):
        opt.step(model.flat_grads)
    return loss, in_flight, exposed


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

