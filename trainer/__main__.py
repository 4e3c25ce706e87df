"""Synchronous data-parallel training of an MLP, gradients averaged by our ring all-reduce.

    mpirun -n 4 python -m trainer                         # digits, 20 epochs, ~97% test accuracy
    mpirun -n 2 python -m trainer --epochs 5 --checkpoint-dir ckpt
    mpirun -n 2 python -m trainer --epochs 10 --checkpoint-dir ckpt --resume
    mpirun -n 2 python -m trainer --dataset synthetic --samples 65536 --features 512 --hidden 1024

Rank 0 initialises the model and broadcasts it. Each step the global batch
(--batch-size) is split across ranks like np.array_split; each rank computes the
gradient sum of its shard scaled by 1/global batch, and all-reducing the flat
gradient buffer gives every rank the exact mean gradient, so n ranks train the
same model as 1 rank with the same global batch (up to float rounding). The buffer
is all-reduced in buckets (--bucket-mb), each launched as soon as backward has
produced it so that communication hides behind the rest of backward; --no-overlap
all-reduces it in one call after backward instead. --strategy local-sgd and diloco
step each replica alone and meet every --sync-every steps; --strategy ps uses
parameter servers (trainer/strategies/).
Every epoch reshuffles with a seed all ranks share. Only rank 0 prints and writes.
"""
from __future__ import annotations

from cmdline.cores import share_cores_between_local_ranks

share_cores_between_local_ranks()

import os  # noqa: E402  (after the thread settings, which numpy reads on import)
import sys  # noqa: E402

import collectives as col  # noqa: E402

if __name__ == "__main__" and "--elastic" in sys.argv[1:]:
    from trainer.arguments import parse_args as _check_flags
    _check_flags()   # a usage error ends every rank alike here, before a supervisor could take another's for a death
    col.elastic.supervise()   # (before MPI starts: see its docstring)
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from cmdline.interrupt import stop_together  # noqa: E402
from cmdline.parser import FAULT, USAGE, launch_note  # noqa: E402
from trainer import data, shards  # noqa: E402
from trainer.arguments import agree_on, check_outputs, parse_args  # noqa: E402
from trainer.common import EpochLog, Interrupted, UsageExit, say, steps_per_epoch  # noqa: E402
from trainer.layout import make_layout  # noqa: E402
from trainer.model import MLP, split_widths  # noqa: E402
from trainer.optim import SGD  # noqa: E402
from trainer.resuming import config_of, earlier_records, resume  # noqa: E402
from trainer.compression import ErrorFeedback  # noqa: E402
from trainer.strategies import allreduce, ps  # noqa: E402
from trainer.strategies.diloco import DiLoCo  # noqa: E402
from trainer.strategies.local_sgd import LocalSGD  # noqa: E402
from trainer.strategies.periodic import Periodic  # noqa: E402


def array_module(device: str):
    """numpy, or cupy with this rank's GPU made current (GPU local rank % visible GPUs)."""
    if device == "cpu":
        return np
    import cupy
    try:
        col.use_local_gpu()
    except col.CollectiveError as e:   # raised alike on every rank
        raise UsageExit(f"--device cuda: {e}", FAULT) from e
    return cupy


def load_dataset(args, xp) -> data.Dataset:
    if args.dataset == "digits":
        dataset = data.digits(args.dtype)
    else:
        dataset = data.synthetic(args.samples, args.features, args.classes, args.dtype)
    if args.batch_size > len(dataset.train_y):
        raise UsageExit(f"--batch-size {args.batch_size} is larger than the training set "
                        f"({len(dataset.train_y)} samples of {args.dataset})")
    if xp is np:
        return dataset
    return data.Dataset(xp.asarray(dataset.train_x), xp.asarray(dataset.train_y), xp.asarray(dataset.test_x),
                        xp.asarray(dataset.test_y), dataset.classes)


def train(args) -> tuple[list[dict], list[dict]]:
    """Train; return the metrics records of the epochs before this run (from --metrics, on
    resume) and those of this run's epochs."""
    newcomer = args.elastic and col.elastic.joining()   # (spawned into a running job: rank 0's state is its start)
    if not newcomer:
        agree_on(check_outputs(args) if col.rank() == 0 else "")
    xp = array_module(args.device)
    dataset = load_dataset(args, xp)
    config = config_of(args, dataset)
    check_world(args, config["sizes"], newcomer)
    layout = make_layout(args.tensor_parallel)
    model = MLP(config["sizes"], np.random.default_rng(args.seed), np.dtype(args.dtype), xp, layout.tp)
    opt = SGD(model.flat_params, args.lr, args.momentum, args.weight_decay)
    periodic, feedback, beyond = strategy_parts(args, model, opt, steps_per_epoch(dataset, args.batch_size))
    earlier = []

    def begin() -> tuple[int, int]:
        """The start's collective part: rank 0's model (or the checkpoint) on every rank. Returns
        the epoch and global step to start at. With --elastic, inside the elastic run: a rank that
        dies here is a change of the world like any other."""
        model.load_full(col.broadcast(model.to_full(model.flat_params), root=0))   # rank 0's initialisation
        start, step = resume(args, model, opt, config, steps_per_epoch(dataset, args.batch_size), *beyond) \
            if args.resume else (0, 0)
        if args.resume and col.rank() == 0:
            earlier[:] = earlier_records(args.metrics, start)
        arrangement = ps.Roles(col.size(), args.servers, 1).describe() if args.strategy == "ps" else str(layout)
        pids = col.allgather(np.array([os.getpid()], np.int64))
        say("ranks (pid): " + ", ".join(f"{r} ({pid})" for r, pid in enumerate(pids)) +
            "  (a launcher that reports a dead pid names its rank here)")
        say(f"training {config['sizes']} on {args.dataset} ({len(dataset.train_y)} train, {len(dataset.test_y)} "
            f"test) with {col.size()} rank(s) as {arrangement}, global batch {args.batch_size}, "
            f"{model.full_size()} parameters")
        if start >= args.epochs:
            say("nothing to do: the checkpoint already covers every epoch")
        return start, step

    log = EpochLog(args, args.resume)
    try:
        if args.elastic:
            history = allreduce.train_elastic(args, dataset, config, model, opt, begin, log, layout, periodic, feedback)
        elif args.strategy == "ps":
            history = ps.train(args, dataset, config, model, opt, *begin(), log)
        else:
            history = allreduce.train(args, dataset, config, model, opt, *begin(), log, layout, periodic, feedback)
    finally:
        log.close()
    return earlier, history


def strategy_parts(args, model: MLP, opt: SGD, per_epoch: int) -> tuple[Periodic | None, ErrorFeedback | None,
                                                                      tuple[dict, object]]:
    """What the all-reduce loop is given beyond the model: for --strategy local-sgd or diloco, the
    helper it asks for local steps and syncs; for --strategy allreduce --compression, the residual
    of this rank's gradients (DiLoCo keeps its own, of its deltas); None where there is none. And
    what a checkpoint holds beyond the model, for ``resume``: the strategy's arrays, the residual."""
    feedback = ErrorFeedback(model.flat_grads, args.compression) \
        if args.strategy == "allreduce" and args.compression != "none" else None
    periodic = LocalSGD(model, opt, args.sync_every, per_epoch, args.inner_state) if args.strategy == "local-sgd" \
        else DiLoCo(model, opt, args.sync_every, per_epoch, args.outer_lr, args.outer_momentum, args.compression,
                    args.inner_state) if args.strategy == "diloco" else None
    residual = feedback.residual if feedback else periodic.residual() if periodic else None
    return periodic, feedback, (periodic.arrays() if periodic else {}, residual)


def check_world(args, sizes: list[int], newcomer: bool) -> None:
    """The flags that depend on the number of ranks fit the world the job started (the same verdict
    on every rank; a ``newcomer`` joins a world that passed them)."""
    if args.elastic and not newcomer and not args.min_ranks <= col.size() <= (args.max_ranks or col.size()):
        flag, bound = ("--min-ranks", args.min_ranks) if col.size() < args.min_ranks else ("--max-ranks", args.max_ranks)
        raise UsageExit(f"{flag} {bound}: the job started {col.size()} rank(s)")
    if args.strategy == "ps":
        ps.check_flags(args, col.size())
    check_split(args.tensor_parallel, sizes)
    if args.reproducible and not newcomer:
        shards.check_world(args.shards, col.size())


def check_split(parts: int, sizes: list[int]) -> None:
    """--tensor-parallel T fits this world and model (the same verdict on every rank)."""
    if col.size() % parts:
        raise UsageExit(f"--tensor-parallel {parts}: {col.size()} rank(s) do not split into groups of {parts} "
                        "(the number of ranks must be a multiple of T)")
    uneven = [width for width in split_widths(sizes, parts) if width % parts]
    if uneven:
        raise UsageExit(f"--tensor-parallel {parts}: the split layers' widths {uneven} (of --hidden) are not "
                        f"multiples of {parts}; each rank must hold an equal part")


def plot(history: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    epochs = [h["epoch"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [h["loss"] for h in history], marker="o")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    right.plot(epochs, [100 * h["train_accuracy"] for h in history], marker="o", label="train")
    right.plot(epochs, [100 * h["test_accuracy"] for h in history], marker="o", label="test")
    right.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
    right.legend()
    for axes in (left, right):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    args = parse_args(argv)
    note = launch_note("python -m trainer")
    if note:
        say(f"note: {note}")
    began = time.perf_counter()
    try:
        with stop_together(finishing=True):   # Ctrl-C or SIGTERM: every rank stops at the same step; after
            # the work, one that comes late does not fail the finished job
            earlier, history = train(args)
    except UsageExit as e:
        say(f"error: {e}")
        return e.status
    except col.CollectiveUsageError as e:   # (raised alike on every rank: a flag the runtime refuses here)
        say(f"error: {e}")
        return USAGE
    except Interrupted as e:
        say(str(e))
        tell_outputs(args)
        return e.status
    if history:
        final = history[-1]
        say(f"done: {len(history)} epoch(s) in {time.perf_counter() - began:.1f}s on {col.size()} rank(s); "
            f"test accuracy {final['test_accuracy']:.2%}")
        if args.plot and col.rank() == 0:
            plot(earlier + history, args.plot)
            say(f"plot written to {args.plot}")
    tell_outputs(args)
    return 0


def tell_outputs(args) -> None:
    """Where rank 0 wrote the run's records (the plot says so when it is drawn)."""
    if args.metrics:
        say(f"metrics written to {args.metrics} (one JSON object per epoch)")
    if args.tensorboard:
        say(f"TensorBoard event files written to {args.tensorboard} (tensorboard --logdir {args.tensorboard})")


def run(argv=None) -> None:
    """The program: main(), with a failure reported by the rank that saw it, and the exit status. Any
    other exception is left uncaught, so that the runtime's farewell tells the ranks waiting for this
    one why it left (``rank 1 left: uncaught RuntimeError: ...``); its traceback is printed by
    :func:`_report_uncaught`, and the exit status is Python's, 1 (FAULT)."""
    sys.excepthook = _report_uncaught   # (the runtime, at its first use, puts its own hook before this one)
    try:
        code = main(argv)
    except col.CollectiveError as e:   # another rank failed or left: it says why; this one says what it saw
        sys.stderr.write(f"[rank {col.rank()}] error: {e}\n")   # (one write: the ranks share the stream)
        sys.stderr.flush()
        code = FAULT
        col.abort(code)   # after the others have had time to report: a rank stuck elsewhere must not keep the job
    sys.exit(code)


def _report_uncaught(kind, value, trace) -> None:
    """sys.excepthook: the traceback in one write, marked with this rank (the ranks share the stream)."""
    sys.stderr.write(f"[rank {col.rank()}] " + "".join(traceback.format_exception(kind, value, trace)))
    sys.stderr.flush()



if __name__ == "__main__":
    run()
