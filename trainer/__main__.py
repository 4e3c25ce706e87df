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
all-reduces it in one call after backward instead.
Every epoch reshuffles with a seed all ranks share. Only rank 0 prints and writes.
"""
from __future__ import annotations

from cmdline.cores import share_cores_between_local_ranks

share_cores_between_local_ranks()

import argparse  # noqa: E402  (after the thread settings, which numpy reads on import)
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import collectives as col  # noqa: E402
from cmdline.parser import (FAULT, USAGE, ArgumentParser, finite_non_negative, finite_positive,  # noqa: E402
                            launch_note)
from trainer import checkpoint, data  # noqa: E402
from trainer.buckets import GradientBuckets  # noqa: E402
from trainer.common import EpochLog, UsageExit, epoch_record, save_checkpoint, say  # noqa: E402
from trainer.layout import make_layout  # noqa: E402
from trainer.model import MLP, split_widths  # noqa: E402
from trainer.optim import SGD  # noqa: E402
from trainer.strategies import ps  # noqa: E402


def _at_least(least: int):
    def parse(text):
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return value
    return parse


_positive_int = _at_least(1)
MIN_SAMPLES = 5   # one sample in five is held out for testing: fewer leave no test set
SYNTHETIC_DEFAULTS: dict[str, int] = {}   # --samples, --features, --classes: filled by parse_args


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m trainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=["digits", "synthetic"], default="digits",
                   help="digits: the embedded 8x8 handwritten digits; synthetic: Gaussian clusters")
    for flag, parse, default, what in (("--samples", _at_least(MIN_SAMPLES), 20000, "number of samples"),
                                       ("--features", _positive_int, 256, "features per sample"),
                                       ("--classes", _positive_int, 10, "number of classes")):
        p.add_argument(flag, type=parse, default=argparse.SUPPRESS,
                       help=f"--dataset synthetic only: {what} (default: {default})")
        SYNTHETIC_DEFAULTS[flag[2:]] = default
    p.add_argument("--hidden", type=_positive_int, nargs="+", default=[64], help="hidden layer widths")
    p.add_argument("--epochs", type=_positive_int, default=20, help="epochs to train (in all, with --resume)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="global batch, split across ranks")
    p.add_argument("--lr", type=finite_positive, default=0.05, help="learning rate")
    p.add_argument("--momentum", type=finite_non_negative, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=finite_non_negative, default=1e-4, help="L2 weight decay")
    p.add_argument("--seed", type=_at_least(0), default=0, help="initialisation and shuffling seed (>= 0)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="element type of the model, the data and the gradients")
    p.add_argument("--bucket-mb", type=finite_positive, default=25.0,
                   help="gradient bucket size in MB (1e6 bytes, as DDP's bucket_cap_mb); each bucket's all-reduce "
                        "starts as soon as backward has produced it (the first bucket holds at most 1 MiB)")
    p.add_argument("--no-overlap", action="store_true",
                   help="one all-reduce of every gradient after backward, instead of buckets overlapped with it")
    p.add_argument("--tensor-parallel", type=_positive_int, default=1, metavar="T",
                   help="split each pair of layers across T consecutive ranks (Megatron-LM's tensor parallelism); "
                        "the n/T replicas train data-parallel. n must be a multiple of T")
    p.add_argument("--strategy", choices=["allreduce", "ps"], default="allreduce",
                   help="allreduce: synchronous data parallelism; ps: parameter servers (see trainer/strategies/ps.py)")
    p.add_argument("--servers", type=_positive_int, default=argparse.SUPPRESS,
                   help="--strategy ps: how many of the ranks (the last ones) are servers (default: 1)")
    p.add_argument("--max-staleness", type=_at_least(0), default=argparse.SUPPRESS, metavar="K",
                   help="--strategy ps: a worker's pull waits until every worker has pushed its step - K "
                        "gradients; 0: synchronous (default: unbounded, fully asynchronous)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the model and data on each rank's GPU (cupy), gradients over NCCL")
    p.add_argument("--metrics", type=Path, help="write one JSON object per epoch to this file; with --resume, "
                                                "the epochs after the checkpoint are replaced (default: none)")
    p.add_argument("--tensorboard", type=Path, metavar="DIR",
                   help="write TensorBoard event files of every epoch's numbers to DIR (rank 0; needs tensorboardX: "
                        "pip install -e '.[tensorboard]') (default: none)")
    p.add_argument("--plot", type=Path, help="draw loss and accuracy curves of the whole run to this PNG "
                                             "(needs matplotlib) (default: none)")
    p.add_argument("--checkpoint-dir", type=Path, help="save checkpoints here (rank 0) (default: none)")
    p.add_argument("--checkpoint-every", type=_positive_int, default=1, help="epochs between checkpoints")
    p.add_argument("--keep", type=_positive_int, default=3, help="checkpoints to keep")
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint")
    p.add_argument("--resume-changed", action="store_true",
                   help="with --resume: continue even where --seed, --batch-size, --lr, --momentum or "
                        "--weight-decay differ from the checkpoint's")
    args = p.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir")
    if args.resume_changed and not args.resume:
        p.error("--resume-changed goes with --resume")
    given = [flag for flag in ("--servers", "--max-staleness") if hasattr(args, flag[2:].replace("-", "_"))]
    if given and args.strategy != "ps":
        p.error(f"{', '.join(given)}: only for --strategy ps")
    args.servers = getattr(args, "servers", 1)
    args.max_staleness = getattr(args, "max_staleness", None)
    if args.strategy == "ps" and args.device != "cpu":
        p.error("--strategy ps: runs on the CPU (--device cpu)")
    given = [f"--{name}" for name in SYNTHETIC_DEFAULTS if hasattr(args, name)]
    if given and args.dataset != "synthetic":
        p.error(f"{', '.join(given)}: only for --dataset synthetic (the digits have their own size)")
    for name, default in SYNTHETIC_DEFAULTS.items():
        setattr(args, name, getattr(args, name, default))
    if args.device == "cuda":
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            p.error(f"--device cuda needs CuPy ({e}): pip install -e '.[cuda13]' (or '.[cuda12]')")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib: pip install -e '.[plot]'")
    if args.tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            p.error("--tensorboard needs tensorboardX: pip install -e '.[tensorboard]'")
    return args


def _agree_on(problem: str) -> None:
    """Rank 0's verdict on a check only it can make (its files) reaches every rank: raise UsageExit
    on every rank if ``problem`` (rank 0's; "status:text") is not empty."""
    message = np.zeros(1024, np.uint8)
    if col.rank() == 0:
        encoded = problem.encode()[:1024]
        message[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    col.broadcast(message, root=0)
    text = message.tobytes().rstrip(b"\0").decode(errors="replace")
    if text:
        status, _, what = text.partition(":")
        raise UsageExit(what, int(status))


def check_outputs(args) -> str:
    """Rank 0, before anything else: every output path can be written, and the checkpoint
    directory is this run's alone (it takes its lock). Returns "status:problem", or ""."""
    for flag, path in (("--metrics", args.metrics), ("--plot", args.plot)):
        if path is None:
            continue
        if path.is_dir():
            return f"{USAGE}:{flag} {path}: is a directory; give a file name"
        if not path.parent.is_dir():
            return f"{USAGE}:{flag} {path}: the directory {path.parent} does not exist"
        if not os.access(path.parent, os.W_OK):
            return f"{FAULT}:{flag} {path}: the directory {path.parent} is not writable"
    if args.tensorboard is not None and args.tensorboard.exists() and not args.tensorboard.is_dir():
        return f"{USAGE}:--tensorboard {args.tensorboard}: is a file, not a directory"
    if args.checkpoint_dir is not None:
        if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
            return f"{USAGE}:--checkpoint-dir {args.checkpoint_dir}: is a file, not a directory"
        try:
            checkpoint.lock(args.checkpoint_dir)
        except checkpoint.InUse as e:
            return f"{USAGE}:--checkpoint-dir {e}"
        except OSError as e:
            return f"{FAULT}:--checkpoint-dir {args.checkpoint_dir}: {e.strerror or e}"
    return ""


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


#: What a resumed run must share with the checkpoint unless --resume-changed: flag -> config key.
RESUME_MUST_MATCH = {"--seed": "seed", "--batch-size": "batch_size", "--lr": "lr", "--momentum": "momentum",
                     "--weight-decay": "weight_decay"}


def config_of(args, dataset) -> dict:
    return {"sizes": [dataset.train_x.shape[1], *args.hidden, dataset.classes], "dtype": args.dtype,
            "dataset": args.dataset, "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr,
            "momentum": args.momentum, "weight_decay": args.weight_decay}


def changed_settings(saved: dict, config: dict) -> list[str]:
    """The training settings this run changes from the checkpoint's (older checkpoints lack some)."""
    return [f"{flag} {saved[key]} -> {config[key]}" for flag, key in RESUME_MUST_MATCH.items()
            if key in saved and saved[key] != config[key]]


def resume(args, model: MLP, opt: SGD, config: dict) -> int:
    """Load the newest valid checkpoint on rank 0 and broadcast it; returns the epoch to start at (0-based).
    A checkpoint holds the whole model, whatever --tensor-parallel wrote it: each rank takes its part."""
    status, problem = np.zeros(2, np.int64), ""   # [found a usable one, epochs already done]
    full_params, full_velocity = (model.xp.empty(model.full_size(), model.flat_params.dtype) for _ in range(2))
    if col.rank() == 0:
        found = checkpoint.newest_valid(args.checkpoint_dir, report=lambda m: print(m, file=sys.stderr))
        if found is None:
            problem = f"{USAGE}:--resume: no usable checkpoint in {args.checkpoint_dir}"
        else:
            path, saved = found
            saved_config = json.loads(str(saved["config"]))
            changed = changed_settings(saved_config, config)
            if saved_config["sizes"] != config["sizes"] or saved["params"].shape != \
                    (model.full_size(),) or str(saved["params"].dtype) != args.dtype:
                problem = f"{USAGE}:--resume: {path.name} was written for another model: {saved['config']}"
            elif changed and not args.resume_changed:
                problem = (f"{USAGE}:--resume: this run changes the checkpoint's settings ({', '.join(changed)}); "
                           "give the same flags, or add --resume-changed to continue with the new ones")
            else:
                full_params[...] = model.xp.asarray(saved["params"])
                full_velocity[...] = model.xp.asarray(saved["velocity"])
                status[:] = (1, checkpoint.epochs_done(saved))
                print(f"resuming from {path} (epoch {checkpoint.epochs_done(saved)} done)", flush=True)
    _agree_on(problem)
    col.broadcast(status, root=0)
    model.load_full(col.broadcast(full_params, root=0))
    model.load_full(col.broadcast(full_velocity, root=0), into=opt.velocity)
    return int(status[1])


def earlier_records(path: Path | None, epochs_done: int) -> list[dict]:
    """The metrics records of the epochs a resumed run keeps (1..epochs_done), from ``path``; the
    file is cut back to them, so that it stays the record of one run whatever crashed when."""
    if path is None or not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue   # a line cut short by a crash
        if isinstance(record, dict) and isinstance(record.get("epoch"), int) and record["epoch"] <= epochs_done:
            kept.append(record)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def train(args) -> tuple[list[dict], list[dict]]:
    """Train; return the metrics records of the epochs before this run (from --metrics, on
    resume) and those of this run's epochs."""
    _agree_on(check_outputs(args) if col.rank() == 0 else "")
    xp = array_module(args.device)
    dataset = load_dataset(args, xp)
    config = config_of(args, dataset)
    if args.strategy == "ps":
        ps.check_flags(args, col.size())
    check_split(args.tensor_parallel, config["sizes"])
    layout = make_layout(args.tensor_parallel)
    model = MLP(config["sizes"], np.random.default_rng(args.seed), np.dtype(args.dtype), xp, layout.tp)
    model.load_full(col.broadcast(model.to_full(model.flat_params), root=0))   # rank 0's initialisation is the model
    opt = SGD(model.flat_params, args.lr, args.momentum, args.weight_decay)
    start = resume(args, model, opt, config) if args.resume else 0
    arrangement = ps.Roles(col.size(), args.servers, 1).describe() if args.strategy == "ps" else str(layout)
    pids = col.allgather(np.array([os.getpid()], np.int64))
    say("ranks (pid): " + ", ".join(f"{r} ({pid})" for r, pid in enumerate(pids)) +
        "  (a launcher that reports a dead pid names its rank here)")
    say(f"training {config['sizes']} on {args.dataset} ({len(dataset.train_y)} train, {len(dataset.test_y)} test) "
        f"with {col.size()} rank(s) as {arrangement}, global batch {args.batch_size}, {model.full_size()} parameters")
    history, n_train, step = [], len(dataset.train_y), start * -(-len(dataset.train_y) // args.batch_size)
    earlier = earlier_records(args.metrics, start) if args.resume and col.rank() == 0 else []
    log = EpochLog(args, args.resume)
    if args.strategy == "ps":
        history = ps.train(args, dataset, config, model, opt, start, step, log)
        log.close()
        return earlier, history
    buckets = None if args.no_overlap else GradientBuckets(model, args.bucket_mb * 1e6, layout.dp)
    for epoch in range(start, args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(n_train)
        loss_sum, comm_s, exposed_s, steps, began = 0.0, 0.0, 0.0, 0, time.perf_counter()
        for first in range(0, n_train, args.batch_size):
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
    log.close()
    check_replicas(model)
    return earlier, history


def check_split(parts: int, sizes: list[int]) -> None:
    """--tensor-parallel T fits this world and model (the same verdict on every rank)."""
    if col.size() % parts:
        raise UsageExit(f"--tensor-parallel {parts}: {col.size()} rank(s) do not split into groups of {parts} "
                        "(the number of ranks must be a multiple of T)")
    uneven = [width for width in split_widths(sizes, parts) if width % parts]
    if uneven:
        raise UsageExit(f"--tensor-parallel {parts}: the split layers' widths {uneven} (of --hidden) are not "
                        f"multiples of {parts}; each rank must hold an equal part")


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
        earlier, history = train(args)
    except UsageExit as e:
        say(f"error: {e}")
        return e.status
    if history:
        final = history[-1]
        say(f"done: {len(history)} epoch(s) in {time.perf_counter() - began:.1f}s on {col.size()} rank(s); "
            f"test accuracy {final['test_accuracy']:.2%}")
        if args.plot and col.rank() == 0:
            plot(earlier + history, args.plot)
            say(f"plot written to {args.plot}")
    else:
        say("nothing to do: the checkpoint already covers every epoch")
    return 0


def run(argv=None) -> None:
    """The program: main(), with a failure reported by the rank that saw it, and the exit status."""
    try:
        code = main(argv)
    except col.CollectiveError as e:   # another rank failed or left: it says why; this one says what it saw
        print(f"[rank {col.rank()}] error: {e}", file=sys.stderr, flush=True)
        code = FAULT
        col.abort(code)   # after the others have had time to report: a rank stuck elsewhere must not keep the job
    except Exception:   # the ranks waiting for this one hear of it at once (the runtime's farewell)
        sys.stderr.write(f"[rank {col.rank()}] " + traceback.format_exc())
        sys.stderr.flush()
        code = FAULT
    sys.exit(code)


if __name__ == "__main__":
    run()
