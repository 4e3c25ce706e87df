"""The all-reduce strategy: synchronous data parallelism. Every rank holds the whole model (or its
tensor-parallel part); each step its gradients are averaged across the replicas by all-reduce,
in buckets launched as backward produces them (``trainer.buckets``), and every rank applies the
same update. Its twin is ``trainer.strategies.ps`` (parameter servers)."""
from __future__ import annotations

import hashlib
import time

import numpy as np

import collectives as col
from cmdline.parser import FAULT
from trainer.buckets import GradientBuckets
from trainer.common import EpochLog, Interrupted, UsageExit, epoch_record, save_checkpoint, say, stop_requested
from trainer.layout import Layout
from trainer.model import MLP
from trainer.optim import SGD


def train(args, dataset, config: dict, model: MLP, opt: SGD, start: int, step: int, log: EpochLog,
          layout: Layout) -> list[dict]:
    """Epochs ``start``..``args.epochs`` of synchronous data-parallel training; returns their records
    (as ``ps.train``). Ends by checking that every rank holds the very same parameters. Ctrl-C on any
    rank stops every rank before the same step (``Interrupted``)."""
    xp, n_train, history = model.xp, len(dataset.train_y), []
    buckets = None if args.no_overlap else GradientBuckets(model, args.bucket_mb * 1e6, layout.dp)
    saved = start if args.resume else None
    for epoch in range(start, args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(n_train)
        loss_sum, comm_s, exposed_s, steps, began = 0.0, 0.0, 0.0, 0, time.perf_counter()
        for first in range(0, n_train, args.batch_size):
            if stop_requested():
                raise Interrupted(f"epoch {epoch + 1}, step {steps + 1} of {-(-n_train // args.batch_size)}",
                                  saved, args.checkpoint_dir)
            batch = order[first: first + args.batch_size]
            shard = xp.asarray(np.array_split(batch, layout.dp_size)[layout.dp_rank])
            loss, in_flight, exposed = train_step(model, opt, buckets, dataset.train_x[shard],
                                                  dataset.train_y[shard], 1.0 / len(batch), layout.dp)
            loss_sum, comm_s, exposed_s, steps, step = loss_sum + loss, comm_s + in_flight, exposed_s + exposed, \
                steps + 1, step + 1
        elapsed = time.perf_counter() - began
        loss = float(col.allreduce(np.array([loss_sum]), group=layout.dp)[0]) / n_train
        record = {**epoch_record(epoch, step, loss, model, dataset, layout, elapsed, steps, comm_s, exposed_s,
                                 str(layout)), "dp": layout.dp_size, "tp": layout.tp_size}
        history.append(record)
        log.write(record)
        last = epoch + 1 == args.epochs
        if args.checkpoint_dir and ((epoch + 1) % args.checkpoint_every == 0 or last):
            save_checkpoint(args, model, opt, epoch, step, config)
            saved = epoch + 1
    check_replicas(model)
    return history


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

