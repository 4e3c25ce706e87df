"""The bench's command line: its flags, their defaults (which depend on --model and --device), and
the checks of what goes together, all made before MPI starts (but a --root that needs the world's
size where the launcher does not say it: ``check_root``, once MPI has started). Usage errors are
said once, by rank 0, in one line."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from bench import gloo, model
from bench.cases import COMPRESSED, DTYPES, IMPLEMENTATIONS, OPS, REDOPS, REDUCING, nccl_supports
from bench.sizes import parse_size
from cmdline.parser import USAGE, ArgumentParser, speaks


class _Parser(ArgumentParser):
    """cmdline's parser, whose errors come in one line naming the flag, and mostly before MPI starts:
    rank 0 is then the launcher's rank 0 (asking MPI would start it)."""

    def error(self, message: str):
        if speaks():
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(USAGE)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv: list[str] | None, n: int | None, description: str = "") -> argparse.Namespace:
    """The flags of ``python -m bench``, with their defaults filled in and checked, before MPI starts.
    ``n``: the world's size where the launcher said it (None: ``check_root`` checks --root once it is known).

    >>> parse_args(["--op", "broadcast", "--root", "1"], 2).root       # doctest: +SKIP
    1
    >>> parse_args(["--op", "allgather", "--redop", "avg"], 2)         # doctest: +SKIP
    python -m bench: error: --redop avg: allgather does not reduce (--redop is for allreduce and reduce_scatter)
    """
    p = _parser(description)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.redop is not None and args.op is not None and args.op not in REDUCING:
        p.error(f"--redop {args.redop}: {args.op} does not reduce (--redop is for {' and '.join(REDUCING)})")
    args.redop = args.redop or "sum"
    args.model_ops = [args.op] if args.op else list(OPS)
    args.op = args.op or "allreduce"
    args.max_bytes = args.max_bytes if args.max_bytes is not None else parse_size("64M" if args.model else "256M")
    args.factor = args.factor if args.factor is not None else (4.0 if args.model else 2.0)
    _check_values(p, args)   # (first: the values need no import, the flags' fit may import torch, 1.4 s)
    if n is not None or args.root < 0:
        check_root(args, n)
    _check_together(p, args)
    return args


def check_root(args: argparse.Namespace, n: int | None) -> None:
    """Exit 2 (rank 0 says why) if --root is not a rank of a world of ``n`` (None: of any world):
    before MPI starts where the launcher said how many it started, else as soon as MPI has, before
    any timing.

    >>> check_root(argparse.Namespace(root=5), 2)     # doctest: +SKIP
    python -m bench: error: --root 5 is out of range for 2 ranks (0..1)
    """
    if args.root < 0 and n is None:
        _parser().error(f"--root {args.root} is out of range: ranks count from 0")
    if n is not None and not 0 <= args.root < n:
        _parser().error(f"--root {args.root} is out of range for {n} ranks (0..{n - 1})")


def _parser(description: str = "") -> _Parser:
    p = _Parser(prog="python -m bench", description=description, formatter_class=argparse.HelpFormatter)
    _flags(p)
    return p


def _flags(p: ArgumentParser) -> None:
    p.add_argument("--op", choices=OPS, default=None,
                   help="the collective (default: allreduce; with --model: all four)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default: float32)")
    p.add_argument("--redop", choices=REDOPS, default=None,
                   help="reduction, for allreduce and reduce_scatter (default: sum)")
    p.add_argument("--min-bytes", type=_size, default="8",
                   help="smallest size: 8, 64K, 256M, 1G (binary units) (default: 8)")
    p.add_argument("--max-bytes", type=_size, default=None, help="largest size (default: 256M; with --model: 64M)")
    p.add_argument("--factor", type=float, default=None,
                   help="each size is the last times this (default: 2; with --model: 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: numpy arrays; cuda: cupy arrays on each rank's GPU (default: cpu)")
    p.add_argument("--impl", nargs="+", choices=list(IMPLEMENTATIONS), default=None,
                   help=f"implementations to time: ring (ours), {' and '.join(COMPRESSED)} (ours with "
                        "compression=: a float32 or float64 allreduce by sum or avg, host arrays), mpi (the MPI "
                        "library's own, host arrays), gloo (torch.distributed's gloo, host arrays), nccl (NCCL's own, GPU arrays) "
                        "(default: ring mpi gloo, gloo where torch is installed; with --device cuda: ring nccl)")
    p.add_argument("--gloo", action=argparse.BooleanOptionalAction, default=None,
                   help="time torch.distributed's gloo beside them, or not (default: on the host, when torch "
                        "is installed and has the dtype; otherwise a note says why the column is left out)")
    p.add_argument("--iters", type=_count, default=0,
                   help="timed iterations per size (default: 0, meaning about 1 GiB per size, 10 to 1000)")
    p.add_argument("--warmup", type=_count, default=None,
                   help="untimed (but checked) iterations first (default: iters/10, at least 1)")
    p.add_argument("--root", type=int, default=0, help="broadcast root (default: 0)")
    p.add_argument("--json", metavar="PATH", help="write every row and the environment as JSON, as each size finishes (default: none)")
    p.add_argument("--csv", metavar="PATH", help="write every row, with the environment, as CSV, as each size finishes (default: none)")
    p.add_argument("--plot", metavar="PATH", help="draw busbw against size to a PNG (needs matplotlib), at the end or on Ctrl-C "
                        "(default: none)")
    p.add_argument("--model", action="store_true",
                   help="fit the cost model (ring/cost.py) to a sweep of every algorithm on the first 2..n ranks, "
                        "print predicted against measured time, then predictions up to 4096 ranks")
    p.add_argument("--link", type=model.parse_link, metavar="BW,LATENCY",
                   help="with --model: the network between hosts for the predictions, like 25GB/s,5us "
                        "(default: this machine's fitted costs)")
    p.add_argument("--hosts", type=model.parse_hosts, metavar="HxL",
                   help="with --model: predict for H hosts of L ranks, two-level all-reduce included, like 512x8")
    p.add_argument("--plant-error", choices=list(IMPLEMENTATIONS), metavar="IMPL",
                   help="for testing the checker: overwrite one element of IMPL's result on the last rank "
                        "(default: none)")


def _check_together(p: ArgumentParser, args: argparse.Namespace) -> None:
    """The flags given go together (and --impl takes its default once --model is known to have none)."""
    if (args.link or args.hosts) and not args.model:
        p.error("--link and --hosts describe the predictions of --model")
    if args.model and (args.device != "cpu" or args.impl or args.plant_error or args.json or args.csv or args.plot):
        p.error("--model times the host algorithms alone: no --device, --impl, --plant-error, --json, --csv, --plot")
    if args.model and args.gloo:
        p.error("--model times the host algorithms alone: no --gloo")
    chosen = args.impl is not None
    if args.impl is None:   # (the default, once --model is known to have none)
        args.impl = ["ring", "nccl"] if args.device == "cuda" else ["ring", "mpi"]
    args.impl = list(dict.fromkeys(args.impl))
    _choose_gloo(p, args, default=not chosen and not args.model and args.device == "cpu")
    if args.device == "cpu" and "nccl" in args.impl:
        p.error("--impl nccl needs --device cuda")
    if args.device == "cuda" and "mpi" in args.impl:
        p.error("--impl mpi times host arrays; with --device cuda compare ring and nccl")
    if args.plant_error is not None and args.plant_error not in args.impl:
        p.error(f"--plant-error {args.plant_error}: not among --impl {' '.join(args.impl)}")
    compressed = [impl for impl in args.impl if impl in COMPRESSED]
    if compressed and (args.op != "allreduce" or args.dtype not in ("float32", "float64")
                       or args.redop not in ("sum", "avg") or args.device != "cpu"):
        p.error(f"--impl {compressed[0]}: compression= is the host all-reduce's, of float32 or float64 by sum "
                "or avg (--op allreduce --dtype float32 --redop sum)")
    if "nccl" in args.impl and not nccl_supports(args.dtype):
        p.error(f"--impl nccl: NCCL has no {args.dtype}")
    if args.device == "cuda":
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            p.error(f'--device cuda needs CuPy ({e}): pip install -e ".[cuda13]" (or ".[cuda12]")')


def _choose_gloo(p: ArgumentParser, args: argparse.Namespace, default: bool) -> None:
    """gloo joins the implementations when asked for (--gloo, --impl gloo) or by ``default`` (unless
    --no-gloo); ``args.gloo_note`` says why a default gloo column is left out (None if it is not)."""
    args.gloo_note = None
    if args.gloo is False:
        args.impl = [impl for impl in args.impl if impl != "gloo"]
    elif args.gloo or "gloo" in args.impl:
        if args.device == "cuda":
            p.error("--gloo times host arrays; with --device cuda compare ring and nccl")
        why = gloo.missing(args.dtype)
        if why:
            p.error(f"--gloo: {why}")
        args.impl += [] if "gloo" in args.impl else ["gloo"]
    elif default:
        args.gloo_note = gloo.missing(args.dtype)
        args.impl += [] if args.gloo_note else ["gloo"]


def _check_values(p: ArgumentParser, args: argparse.Namespace) -> None:
    """The sizes, the root's sign and the output paths make sense, and what --plot needs is installed."""
    if args.min_bytes <= 0:
        p.error(f"--min-bytes must be > 0, got {args.min_bytes}")
    if args.max_bytes < args.min_bytes:
        p.error(f"--max-bytes ({args.max_bytes}) is below --min-bytes ({args.min_bytes})")
    if args.factor <= 1:
        p.error(f"--factor must be > 1, got {args.factor:g}")
    if args.redop == "avg" and np.dtype(args.dtype).kind in "iu" and args.op in REDUCING:
        p.error(f"--redop avg needs a floating --dtype, not {args.dtype}")
    for option in ("json", "csv", "plot"):
        path = getattr(args, option)
        if path is not None and not os.access(Path(path).resolve().parent, os.W_OK):
            p.error(f"--{option} {path}: its directory does not exist or is not writable")
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (found now, not after the whole sweep)
        except ImportError as e:
            p.error(f'--plot needs matplotlib ({e}): pip install -e ".[plot]"')
