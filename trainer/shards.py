"""``--reproducible``: the same parameters, bit for bit, at any world size.

Each global batch is cut into ``--shards S`` virtual shards (``np.array_split``: sizes differ by one
sample at most), a number fixed for the run whatever the number of ranks. Rank r of n takes shards
r*S/n to (r+1)*S/n - 1 and computes each one's gradient on its own, as the sum over the shard's
samples divided by the whole batch's size, so that the shards' gradients add up to the batch's
mean gradient. Those S gradients are the contributions of the reproducible all-reduce
(``col.allreduce(list, reproducible=True)``): their exact sum, rounded once. A shard's gradient
depends on the parameters and the shard's samples alone, and the sum on the contributions alone,
so every step gives the same bits at 1, 2, 3, 4 or 6 ranks, and after an elastic change deals the
shards again. What else could depend on the world size does not: the data order is the seed's,
the start is rank 0's model broadcast, the optimizer runs alike on every rank, and the
accuracies are exact integer counts. The printed loss is each rank's sum of its shards' losses,
summed: it may differ in its last digits; it feeds nothing.

Not with local SGD or DiLoCo (between syncs each replica steps on its own part of every batch, so
the training itself is another at another world size), parameter servers, ``--compression``
(rounding on the wire), ``--tensor-parallel`` above 1 (its partial products are summed in float)
or ``--device cuda`` (the reproducible all-reduce takes host arrays).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import collectives as col
from trainer.common import UsageExit
from trainer.model import MLP
from trainer.optim import SGD

#: The default --shards: 1, 2, 3, 4, 6 and 12 ranks take equal parts of it.
DEFAULT_SHARDS = 12


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reproducible", action="store_true",
                   help="the same parameters, bit for bit, on any number of ranks (and after an --elastic change): "
                        "each batch is cut into --shards virtual shards, whose gradients are summed exactly and "
                        "rounded once (col.allreduce(..., reproducible=True)); slower (docs/reproducible.md)")
    p.add_argument("--shards", type=int, default=argparse.SUPPRESS, metavar="S",
                   help=f"--reproducible: virtual shards of each global batch; the number of ranks must divide it "
                        f"(default: {DEFAULT_SHARDS})")


def refusal(args: argparse.Namespace) -> str:
    """What the flags given say against --reproducible ("": nothing); sets --shards' default.

    >>> from types import SimpleNamespace as S
    >>> refusal(S(reproducible=True, strategy="diloco", compression="none", tensor_parallel=1, device="cpu"))[:45]
    '--reproducible: not with --strategy diloco: b'
    """
    if not args.reproducible:
        return "--shards: only with --reproducible" if hasattr(args, "shards") else ""
    args.shards = getattr(args, "shards", DEFAULT_SHARDS)
    if args.strategy in ("local-sgd", "diloco"):
        return (f"--reproducible: not with --strategy {args.strategy}: between syncs each replica steps on its own "
                "part of every batch, so the training itself changes with the number of ranks")
    if args.shards < 1:
        return f"--shards {args.shards}: must be >= 1"
    if args.batch_size < args.shards:
        return f"--batch-size {args.batch_size} is smaller than --shards {args.shards}: each virtual shard needs a sample"
    for flag, reason in [(args.strategy == "ps" and "--strategy ps", "the servers apply each gradient as it comes"),
                         (args.compression != "none" and f"--compression {args.compression}",
                          "the wire would round what the exact sum adds"),
                         (args.tensor_parallel != 1 and f"--tensor-parallel {args.tensor_parallel}",
                          "its partial products are summed in floating point"),
                         (args.device != "cpu" and f"--device {args.device}",
                          "the reproducible all-reduce takes host arrays")]:
        if flag:
            return f"--reproducible: not with {flag}: {reason}"
    return ""


def check_world(shards: int, size: int) -> None:
    """At the start: ``size`` ranks take equal parts of ``shards`` (the same verdict on every rank).

    >>> check_world(12, 5)
    Traceback (most recent call last):
    ...
    trainer.common.UsageExit: --shards 12: 5 rank(s) cannot take equal parts of the 12 virtual shards of each batch (--reproducible); run on 1, 2, 3, 4, 6 or 12 rank(s), or give --shards a multiple of 5
    """
    if shards % size:
        sizes = [str(n) for n in range(1, shards + 1) if shards % n == 0]
        raise UsageExit(f"--shards {shards}: {size} rank(s) cannot take equal parts of the {shards} virtual shards of "
                        f"each batch (--reproducible); run on {', '.join(sizes[:-1])} or {sizes[-1]} rank(s), or give "
                        f"--shards a multiple of {size}")


class VirtualShards:
    """This rank's virtual shards of each batch, and the step that sums their gradients exactly.

    >>> shards = VirtualShards(4)
    >>> [s.tolist() for s in shards.mine(np.arange(10, 20), size=2, rank=1)]   # shards 2 and 3 of 4
    [[16, 17], [18, 19]]
    >>> [len(shards.mine(np.arange(10), 3, r)) for r in range(3)]   # (after an elastic change: one more for some)
    [2, 1, 1]
    """

    def __init__(self, count: int):
        self.count = count
        self.buffers: list = []   # one gradient per shard this rank holds, kept between steps

    def mine(self, batch: np.ndarray, size: int, rank: int) -> list[np.ndarray]:
        """The sample indices of each shard of ``batch`` that rank ``rank`` of ``size`` takes: a
        contiguous run of shards, equal runs where ``size`` divides the count."""
        pieces = np.array_split(batch, self.count)
        return [pieces[k] for k in np.array_split(np.arange(self.count), size)[rank]]

    def train_step(self, model: MLP, opt: SGD, shards: list, batch: int,
                   dp: col.Group | None = None) -> tuple[float, float, float]:
        """One step on this rank's ``shards`` ((x, y) each) of a global batch of ``batch`` samples:
        each shard's gradient on its own, all of them summed exactly over the ranks of ``dp``, then
        the update. Returns the loss sum of the shards, and the seconds of the all-reduce twice
        (in flight, exposed: nothing hides it), as ``allreduce.train_step``."""
        while len(self.buffers) < max(len(shards), 1):
            self.buffers.append(model.xp.zeros_like(model.flat_grads))
        loss = 0.0
        for (x, y), buffer in zip(shards, self.buffers):
            loss += model.loss_and_grads(x, y, 1.0 / batch)
            buffer[...] = model.flat_grads
        if not shards:   # (more ranks than shards, after an elastic change: an exact zero adds nothing)
            self.buffers[0][...] = 0
        began = time.perf_counter()
        col.allreduce(self.buffers[:max(len(shards), 1)], op="sum", reproducible=True, out=model.flat_grads,
                      group=dp, name="shard gradients")
        seconds = time.perf_counter() - began
        with col.timeline.span("optimizer step"):
            opt.step(model.flat_grads)
        return loss, seconds, seconds
