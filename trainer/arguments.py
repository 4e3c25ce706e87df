"""The trainer's command line: its flags, and the checks that only rank 0 can make (its files).

Usage errors are said once, by rank 0, and every rank exits with the same status (``cmdline.parser``).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import collectives as col
from cmdline.memory import available_memory, gib, ranks_on_this_host
from cmdline.parser import FAULT, USAGE, ArgumentParser, finite, finite_non_negative, finite_positive
from trainer import checkpoint, compression, data, shards
from trainer.common import UsageExit
from trainer.strategies.periodic import INNER_STATES

#: What a resumed run must share with the checkpoint unless --resume-changed: flag -> config key
#: (``trainer.resuming`` compares them; the flag's help lists them).
RESUME_MUST_MATCH = {"--dataset": "dataset", "--seed": "seed", "--batch-size": "batch_size", "--lr": "lr",
                     "--momentum": "momentum", "--weight-decay": "weight_decay", "--sync-every": "sync_every",
                     "--outer-lr": "outer_lr", "--outer-momentum": "outer_momentum", "--compression": "compression",
                     "--inner-state": "inner_state", "--shards": "shards"}


def _at_least(least: int):
    def parse(text):
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return value
    return parse



_positive_int = _at_least(1)


#: The end of --help: which strategy and compression, when (docs/training.md says more).
STRATEGY_NOTE = """\
Which strategy: allreduce (the default) averages the gradients every step, the most accurate, and the fastest where \
the links are fast (one host, a datacenter network). Where the all-reduce takes most of a step (the epoch line's \
comm share near 100%: slow or shared links), --compression bf16 (or fp16, finer but of narrow range) puts half the \
bytes on the wire, with error feedback so that rounding is delayed, not lost: a small cost in accuracy.
Where the links are slow, --strategy local-sgd or diloco meet only every --sync-every H steps (2/H of the bytes: \
parameters or deltas, and momentum; 1/H with --inner-state local, which keeps each replica's momentum its own): the \
replicas drift apart between syncs, which costs accuracy as H grows; DiLoCo's outer Nesterov step (--outer-lr, \
--outer-momentum) wins much of it back, and compresses its deltas too. Measured across 2 hosts at 200 Mbit/s \
(5 rounds, min-max of the time over the all-reduce's): bf16 0.60-0.69x, DiLoCo (H = 16) 0.25-0.34x, and \
0.18-0.30x with --inner-state local (docs/slow-links.md).
--strategy ps: parameter servers, the workers asynchronous (--max-staleness bounds it): slow workers hold \
nobody up, at the cost of stale gradients and lower accuracy."""


def _paragraphs(base: type) -> type:
    """``base`` (a help formatter) that wraps each line of a description or epilog as a paragraph of its own."""
    class Paragraphs(base):
        def _fill_text(self, text, width, indent):
            return "\n".join(super(Paragraphs, self)._fill_text(part, width, indent) for part in text.splitlines())
    return Paragraphs


MIN_SAMPLES = 5   # one sample in five is held out for testing: fewer leave no test set


SYNTHETIC_DEFAULTS: dict[str, int] = {}   # --samples, --features, --classes: filled by parse_args



def parse_args(argv=None) -> argparse.Namespace:
    """The flags of ``python -m trainer``, checked (a usage error exits on every rank with status 2)."""
    p = ArgumentParser(prog="python -m trainer", description="Synchronous data-parallel training of an MLP, "
                                                             "gradients averaged by our ring all-reduce.",
                       epilog=STRATEGY_NOTE)
    p.formatter_class = _paragraphs(p.formatter_class)
    _model_flags(p)
    _run_flags(p)
    args = p.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir")
    if args.resume_changed and not args.resume:
        p.error("--resume-changed goes with --resume")
    _check_strategy_flags(p, args)
    if problem := shards.refusal(args):
        p.error(problem)
    if args.elastic and (args.strategy == "ps" or args.tensor_parallel != 1 or args.device != "cpu"):
        p.error("--elastic: only with --strategy allreduce, local-sgd or diloco, --tensor-parallel 1 and "
                "--device cpu")
    given = [flag for flag, value in (("--min-ranks", args.min_ranks != 1), ("--max-ranks", args.max_ranks),
                                      ("--commit-every", args.commit_every != 1),
                                      ("--host-discovery", args.host_discovery is not None)) if value]
    if given and not args.elastic:
        p.error(f"{', '.join(given)}: only with --elastic")
    if args.host_discovery is not None and not args.host_discovery.strip():
        p.error("--host-discovery: expected a command that prints host:slots lines, got an empty one")
    if args.max_ranks is not None and args.max_ranks < args.min_ranks:
        p.error(f"--max-ranks {args.max_ranks} is below --min-ranks {args.min_ranks}")
    if args.max_steps is not None and args.strategy == "ps":
        p.error("--max-steps: not with --strategy ps")
    if args.strategy == "ps" and args.device != "cpu":
        p.error("--strategy ps: runs on the CPU (--device cpu)")
    given = [f"--{name}" for name in SYNTHETIC_DEFAULTS if hasattr(args, name)]
    if given and args.dataset != "synthetic":
        p.error(f"{', '.join(given)}: only for --dataset synthetic (the digits have their own size)")
    for name, default in SYNTHETIC_DEFAULTS.items():
        setattr(args, name, getattr(args, name, default))
    _check_extras(p, args)
    _check_memory(p, args)
    return args


#: Copies of the model each rank holds at once: parameters, gradients, momentum, the elastic
#: commit, the checkpoint's host copy, and room for the activations of a batch; and what each
#: strategy or flag adds: the last sync's parameters and momentum (and DiLoCo's outer momentum),
#: the residual of error feedback, and the fused buffer of a sync.
_MODEL_COPIES = 6
_MORE_COPIES = {"local-sgd": 3, "diloco": 4}


#: Each strategy's flags, and their defaults (the DiLoCo paper's for the outer optimizer).
STRATEGY_FLAGS = {"--servers": (("ps",), 1), "--max-staleness": (("ps",), None),
                  "--sync-every": (("local-sgd", "diloco"), 16), "--outer-lr": (("diloco",), 0.5),
                  "--outer-momentum": (("diloco",), 0.5), "--inner-state": (("local-sgd", "diloco"), "averaged")}


def _check_strategy_flags(p: ArgumentParser, args: argparse.Namespace) -> None:
    """Each strategy's flags only with it (then their defaults set), and --compression where there
    is an all-reduce of gradients or deltas to compress."""
    for flag, (strategies, default) in STRATEGY_FLAGS.items():
        name = flag[2:].replace("-", "_")
        if hasattr(args, name) and args.strategy not in strategies:
            p.error(f"{flag}: only for --strategy {' or '.join(strategies)}")
        setattr(args, name, getattr(args, name, default))
    if args.compression != "none" and args.strategy not in ("allreduce", "diloco"):
        why = "the servers take each gradient whole" if args.strategy == "ps" else \
            "local SGD averages the parameters themselves, which rounding would move for good; --strategy diloco " \
            "--outer-lr 1 --outer-momentum 0 is local SGD on deltas, which can be compressed"
        p.error(f"--compression {args.compression}: only for --strategy allreduce or diloco ({why})")
    if args.compression != "none" and args.device != "cpu":
        p.error(f"--compression {args.compression}: runs on the CPU (--device cpu): the ring compresses host arrays only")
    if args.inner_state == "local" and (args.elastic or args.tensor_parallel != 1):
        why = "--elastic: a change hands every rank rank 0's state, the other replicas' momenta lost" if args.elastic \
            else f"--tensor-parallel {args.tensor_parallel}: the checkpoint keeps each rank's momentum whole only " \
                 "without tensor parallelism"
        p.error(f"--inner-state local: not with {why}; use --inner-state averaged")
    if args.elastic and args.commit_every != 1 and args.strategy in ("local-sgd", "diloco"):
        p.error(f"--commit-every: not with --strategy {args.strategy}, which commits at every sync (--sync-every)")


def _fraction(text: str) -> float:
    """A float in [0, 1) (argparse type: a momentum)."""
    value = finite(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _check_memory(p: ArgumentParser, args: argparse.Namespace) -> None:
    """The model and the data fit in this host's memory for the ranks on it (a usage error, on every
    rank alike, instead of a MemoryError or the OOM killer after the start)."""
    itemsize = np.dtype(args.dtype).itemsize
    features, classes = ((data.DIGITS_FEATURES, data.DIGITS_CLASSES) if args.dataset == "digits"
                         else (args.features, args.classes))
    widths = [features, *args.hidden, classes]
    parameters = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    samples = args.samples * (features * itemsize + 8) if args.dataset == "synthetic" else 0
    ranks = ranks_on_this_host()
    copies = _MODEL_COPIES + _MORE_COPIES.get(args.strategy, 0) + (args.compression != "none")
    need = (copies * parameters * itemsize + samples) * ranks
    available = available_memory()
    if available is not None and need > available:
        p.error(f"--hidden {' '.join(map(str, args.hidden))}"
                + (f" with --samples {args.samples} --features {features}" if samples else "")
                + f": {parameters:,} parameters" + (f" and {gib(samples)} of data" if samples else "")
                + f" need about {gib(need)} for the {ranks} rank(s) on this host, which has "
                f"{gib(available)} available")


def _check_extras(p: ArgumentParser, args: argparse.Namespace) -> None:
    """The optional packages the flags given need are installed."""
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


def _model_flags(p: ArgumentParser) -> None:
    """What is trained, and how: the data, the model, the optimizer."""
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


def _run_flags(p: ArgumentParser) -> None:
    """How the run goes: communication, strategy, device, outputs, checkpoints."""
    p.add_argument("--bucket-mb", type=finite_positive, default=25.0,
                   help="gradient bucket size in MB (1e6 bytes, as DDP's bucket_cap_mb); each bucket's all-reduce "
                        "starts as soon as backward has produced it (the first bucket holds at most 1 MiB)")
    p.add_argument("--no-overlap", action="store_true",
                   help="one all-reduce of every gradient after backward, instead of buckets overlapped with it")
    p.add_argument("--tensor-parallel", type=_positive_int, default=1, metavar="T",
                   help="split each pair of layers across T consecutive ranks (Megatron-LM's tensor parallelism); "
                        "the n/T replicas train data-parallel. n must be a multiple of T")
    _strategy_flags(p)
    shards.add_flags(p)
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
    p.add_argument("--keep", type=_positive_int, default=3, help="epoch checkpoints to keep; a stop's step "
                   "checkpoint (SIGTERM, --max-steps) stays only until the next checkpoint")
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint (of any number "
                   "of ranks); with none yet, from the beginning (one batch script for the first run and each requeue)")
    p.add_argument("--max-steps", type=_positive_int, metavar="S",
                   help="stop after global step S (counted over the whole run, with --resume too), writing a "
                        "checkpoint of that step with --checkpoint-dir (default: train every epoch)")
    p.add_argument("--elastic", action="store_true",
                   help="go on when ranks die: the survivors continue from the last commit in a world of their "
                        "own (launch with mpiexec -disable-auto-cleanup; see docs/elastic.md)")
    p.add_argument("--min-ranks", type=_positive_int, default=1,
                   help="--elastic: end the job when fewer ranks than this remain (default: 1)")
    p.add_argument("--max-ranks", type=_positive_int, help="--elastic: never grow beyond this many ranks")
    p.add_argument("--host-discovery", metavar="SCRIPT",
                   help="--elastic: a command that prints the hosts the job may use, one 'host:slots' line each; "
                        "run by rank 0 every second, and at a commit where it lists free slots new ranks start "
                        "there and join (up to --max-ranks)")
    p.add_argument("--commit-every", type=_positive_int, default=1, metavar="K",
                   help="--elastic: commit (keep in memory what a change rolls back to) every K steps, and at "
                        "every epoch's end (default: 1)")
    *most, last = RESUME_MUST_MATCH
    p.add_argument("--resume-changed", action="store_true",
                   help=f"with --resume: continue even where {', '.join(most)} or {last} differ from the checkpoint's")



def _strategy_flags(p: ArgumentParser) -> None:
    """The strategy, each one's own flags, and compression (their defaults: ``STRATEGY_FLAGS``)."""
    p.add_argument("--strategy", choices=["allreduce", "local-sgd", "diloco", "ps"], default="allreduce",
                   help="allreduce: synchronous data parallelism; local-sgd, diloco: replicas that meet every "
                        "--sync-every steps; ps: parameter servers (see trainer/strategies/ and the note below)")
    p.add_argument("--servers", type=_positive_int, default=argparse.SUPPRESS,
                   help="--strategy ps: how many of the ranks (the last ones) are servers (default: 1)")
    p.add_argument("--max-staleness", type=_at_least(0), default=argparse.SUPPRESS, metavar="K",
                   help="--strategy ps: a worker's pull waits until every worker has pushed its step - K "
                        "gradients; 0: synchronous (default: unbounded, fully asynchronous)")
    p.add_argument("--sync-every", type=_positive_int, default=argparse.SUPPRESS, metavar="H",
                   help="--strategy local-sgd or diloco: local steps between two syncs (an epoch's last step "
                        "always syncs) (default: 16)")
    p.add_argument("--outer-lr", type=finite_positive, default=argparse.SUPPRESS, metavar="LR",
                   help="--strategy diloco: the outer optimizer's learning rate (default: 0.5; the DiLoCo paper's 0.7 "
                        "with momentum 0.9 diverged on --dataset synthetic: docs/slow-links.md)")
    p.add_argument("--outer-momentum", type=_fraction, default=argparse.SUPPRESS, metavar="M",
                   help="--strategy diloco: the outer optimizer's Nesterov momentum, in [0, 1) (default: 0.5)")
    p.add_argument("--inner-state", choices=INNER_STATES, default=argparse.SUPPRESS,
                   help="--strategy local-sgd or diloco: what a sync does with the inner optimizer's momentum. "
                        "averaged: averaged with the parameters (twice the bytes; a checkpoint is the whole state, "
                        "which any number of ranks resumes exactly); local: each replica keeps its own, as in the "
                        "DiLoCo paper (half the bytes; a checkpoint holds every rank's, given back bit for bit only "
                        "on as many ranks, else their average; not with --elastic or --tensor-parallel) "
                        "(default: averaged)")
    p.add_argument("--compression", choices=["none", *compression.CODECS], default="none",
                   help="--strategy allreduce or diloco: what the gradients (diloco: the deltas) cross the wire "
                        "as, half the bytes for bf16 and fp16, with error feedback (each rank adds what rounding "
                        "took from its last contribution to its next)")


def agree_on(problem: str) -> None:
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
        return "" if args.resume else _earlier_run(args.checkpoint_dir)
    return ""


def _earlier_run(directory: Path) -> str:
    """A fresh run must not write among another run's checkpoints (a later --resume would pick
    whichever is newest): "status:problem" if ``directory`` holds any, else ""."""
    found = sorted(p.name for p in directory.glob(checkpoint.PATTERN))
    if not found:
        return ""
    held = found[0] if len(found) == 1 else f"{len(found)} checkpoints, {found[0]} to {found[-1]}"
    return (f"{USAGE}:--checkpoint-dir {directory}: holds an earlier run's checkpoints ({held}); "
            "continue that run with --resume, or give this one an empty directory")

