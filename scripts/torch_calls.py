"""The torch.distributed calls themselves, "ring" against gloo, side by side in one launch:

    mpiexec -n 2 python scripts/torch_calls.py [--sizes 8,1K,1M,64M] [--repeats 30] [--async]

Two process groups span the same ranks: gloo, torch's default group (a TCP rendezvous on a port
rank 0 picks and sends to the others over MPI), and "ring" (``dist.new_group(backend="ring")``).
For every collective and size, one call on each backend with rank-dependent inputs first (their
results must agree, or the verdict says WRONG), then --warmup untimed and --repeats timed
repetitions; in each repetition every backend makes the call once, in an order that rotates,
each call after an MPI barrier and counted as the slowest rank's time. The table shows the
medians: the synchronous call (with --async: ``async_op=True``, then ``wait()``), and for sizes
up to --col-max the same call of the collectives API on numpy arrays as a reference
(``col.allreduce(a, out=a)``, ``col.gather(x, root=0, out=o)``, ...). The verdict is against the
target: ring no slower than gloo, and a small call (where col is timed) within 2x of the same
col call + 20 us.

A size is the whole buffer, float32: all_reduce's, broadcast's and reduce's tensor, all_gather's
and gather's output, reduce_scatter's, all_to_all's and scatter's input; rounded down to split
evenly over the ranks (one element each at least). Only rank 0 prints. Timings are shown, never
asserted: on a shared machine compare only the figures of one run.
"""
from __future__ import annotations

import argparse
import math
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import collectives as col
import collectives.torch  # noqa: F401 - registers "ring"
from cmdline.parser import ArgumentParser

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
               "gather", "scatter", "reduce", "barrier")
ROOT = 0
SLACK_US = 20.0
#: torch 2.13 deprecates these two names (each call warns); their successors make the same call.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Buffers:
    """One backend's tensors for one collective and size: its input and its output (a tensor, a
    list of tensors at gather's and scatter's root, or None where the call works in place)."""
    inp: Any
    out: Any


@dataclass
class Row:
    """One collective at one size: the medians in microseconds (col: None where not timed)."""
    collective: str
    size: str
    ring_us: float = 0.0
    gloo_us: float = 0.0
    col_us: float | None = None
    verdict: str = ""


def values(count: int, rank: int, salt: int = 0) -> torch.Tensor:
    """Small rank-dependent integers as float32: every sum of them is exact."""
    return ((torch.arange(count) * 7 + rank * 13 + salt) % 11 + 1).to(torch.float32)


def split_count(collective: str, nbytes: int, n: int) -> int:
    """Elements of the whole buffer: float32, a multiple of ``n`` where the call splits it."""
    count = max(nbytes // 4, 1)
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count
    return max(count - count % n, n)


def buffers(collective: str, count: int, n: int, rank: int) -> Buffers:
    """Fresh tensors for ``collective`` over ``count`` elements on ``n`` ranks."""
    block, root = count // n, rank == ROOT
    if collective in ("all_reduce", "broadcast", "reduce"):
        return Buffers(values(count, rank), None)
    if collective == "all_gather_into_tensor":
        return Buffers(values(block, rank), torch.zeros(count))
    if collective in ("reduce_scatter_tensor", "all_to_all_single"):
        return Buffers(values(count, rank), torch.zeros(count if collective == "all_to_all_single" else block))
    if collective == "gather":
        return Buffers(values(block, rank), [torch.zeros(block) for _ in range(n)] if root else None)
    if collective == "scatter":
        return Buffers([values(block, rank, j) for j in range(n)] if root else None, torch.zeros(block))
    return Buffers(None, None)   # barrier


def result(collective: str, b: Buffers, rank: int) -> torch.Tensor:
    """What this rank holds after the call (nothing where the call leaves it undefined)."""
    if collective in ("all_reduce", "broadcast") or (collective == "reduce" and rank == ROOT):
        return b.inp
    if collective == "gather" and rank == ROOT:
        return torch.cat(b.out)
    if collective in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "scatter"):
        return b.out
    return torch.zeros(0)


def torch_call(collective: str, b: Buffers, group: Any, async_op: bool) -> Callable[[], Any]:
    """The call of ``collective`` on ``group`` with ``b``, returning when it is done."""
    calls = {
        "all_reduce": lambda: dist.all_reduce(b.inp, group=group, async_op=async_op),
        "broadcast": lambda: dist.broadcast(b.inp, src=ROOT, group=group, async_op=async_op),
        "all_gather_into_tensor": lambda: ALL_GATHER(b.out, b.inp, group=group, async_op=async_op),
        "reduce_scatter_tensor": lambda: REDUCE_SCATTER(b.out, b.inp, group=group, async_op=async_op),
        "all_to_all_single": lambda: dist.all_to_all_single(b.out, b.inp, group=group, async_op=async_op),
        "gather": lambda: dist.gather(b.inp, b.out, dst=ROOT, group=group, async_op=async_op),
        "scatter": lambda: dist.scatter(b.out, b.inp, src=ROOT, group=group, async_op=async_op),
        "reduce": lambda: dist.reduce(b.inp, dst=ROOT, group=group, async_op=async_op),
        "barrier": lambda: dist.barrier(group=group, async_op=async_op),
    }
    call = calls[collective]
    return (lambda: call().wait()) if async_op else call


def col_call(collective: str, count: int, n: int, rank: int, async_op: bool) -> Callable[[], Any]:
    """The same collective through the collectives API, on numpy arrays of the same sizes."""
    block, root = count // n, rank == ROOT
    a, x, o = values(count, rank).numpy(), values(block, rank).numpy(), np.zeros(count, np.float32)
    kw = {"async_op": async_op}
    calls = {
        "all_reduce": lambda: col.allreduce(a, out=a, **kw),
        "broadcast": lambda: col.broadcast(a, root=ROOT, **kw),
        "all_gather_into_tensor": lambda: col.allgather(x, out=o, **kw),
        "reduce_scatter_tensor": lambda: col.reduce_scatter(a, out=o[:block], **kw),
        "all_to_all_single": lambda: col.alltoall(a, out=o, **kw),
        "gather": lambda: col.gather(x, root=ROOT, out=o[:n * block] if root else None, **kw),
        "scatter": lambda: col.scatter(a if root else None, root=ROOT, **kw),
        "reduce": lambda: col.reduce(a, root=ROOT, out=a if root else None, **kw),
        "barrier": lambda: col.barrier(**kw),
    }
    call = calls[collective]
    return (lambda: call().wait()) if async_op else call


def time_in_turn(comm: MPI.Comm, calls: dict[str, Callable[[], Any]], repeats: int, warmup: int) -> dict[str, float]:
    """Median microseconds of each call: every repetition makes each call once, the first of them
    rotating; each call after a barrier, counted as the slowest rank's time."""
    names = list(calls)
    seconds = np.zeros((len(names), repeats))
    for i in range(warmup + repeats):
        for k in range(len(names)):
            j = (i + k) % len(names)
            comm.Barrier()
            start = time.perf_counter()
            calls[names[j]]()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                seconds[j, i - warmup] = elapsed
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return {name: float(np.median(seconds[k])) * 1e6 for k, name in enumerate(names)}


def verdict(row: Row) -> str:
    """The row against the target: ring no slower than gloo; a small call within 2x col + 20 us."""
    misses = ["slower than gloo"] if row.ring_us > row.gloo_us else []
    if row.col_us is not None and row.ring_us > 2 * row.col_us + SLACK_US:
        misses.append(f"over 2x col + {SLACK_US:.0f} us ({2 * row.col_us + SLACK_US:.1f})")
    return "; ".join(misses) or "ok"


def measure(comm: MPI.Comm, groups: dict[str, Any], collective: str, nbytes: int,
            args: argparse.Namespace) -> Row:
    """One row: the results checked once, then the backends (and col, for small sizes) timed."""
    n, rank = comm.Get_size(), comm.Get_rank()
    count = split_count(collective, nbytes, n)
    row = Row(collective, "-" if collective == "barrier" else col.format_size(nbytes))
    held = {name: buffers(collective, count, n, rank) for name in groups}
    for name, group in groups.items():
        torch_call(collective, held[name], group, False)()
    same = torch.equal(result(collective, held["ring"], rank), result(collective, held["gloo"], rank))
    calls = {name: torch_call(collective, held[name], group, args.async_op) for name, group in groups.items()}
    if nbytes <= args.col_max:
        calls["col"] = col_call(collective, count, n, rank, args.async_op)
    medians = time_in_turn(comm, calls, args.repeats, args.warmup)
    row.ring_us, row.gloo_us, row.col_us = medians["ring"], medians["gloo"], medians.get("col")
    agreed = comm.allreduce(same, op=MPI.LAND)
    row.verdict = verdict(row) if agreed else "WRONG: ring and gloo disagree"
    return row


def line(row: Row) -> str:
    """One line of the table."""
    col_us = f"{row.col_us:>10.1f}" if row.col_us is not None else f"{'-':>10}"
    ratio = row.ring_us / row.gloo_us if row.gloo_us else math.nan
    return (f"{row.collective:<24} {row.size:>6} {row.ring_us:>10.1f} {row.gloo_us:>10.1f} {ratio:>10.2f} "
            f"{col_us}  {row.verdict}")


HEADER = f"{'collective':<24} {'size':>6} {'ring us':>10} {'gloo us':>10} {'ring/gloo':>10} {'col us':>10}  verdict"


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sizes(text: str) -> list[int]:
    try:
        return [col.parse_size(size) for size in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (sizes read as ``collectives.parse_size`` reads them)."""
    p = ArgumentParser(prog="scripts/torch_calls.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=_sizes, default="8,1K,1M,64M", help="comma-separated sizes (default: 8,1K,1M,64M)")
    p.add_argument("--repeats", type=int, default=30, help="timed repetitions per row (default: 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (default: 3)")
    p.add_argument("--async", dest="async_op", action="store_true",
                   help="time async_op=True and wait() instead of the synchronous call (col: the same)")
    p.add_argument("--col-max", type=lambda text: _sizes(text)[0], default="64K",
                   help="time the col reference up to this size (default: 64K)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="comma-separated subset of the collectives (default: all)")
    args = p.parse_args(argv)
    args.collectives = args.collectives.split(",")
    unknown = set(args.collectives) - set(COLLECTIVES)
    if unknown or args.repeats < 1 or args.warmup < 0:
        p.error(f"unknown collectives {sorted(unknown)}" if unknown else "--repeats >= 1 and --warmup >= 0")
    return args


def header(comm: MPI.Comm, args: argparse.Namespace) -> list[str]:
    """The lines above the table."""
    mode = "async_op=True, then wait()" if args.async_op else "synchronous calls"
    return [f"# {comm.Get_size()} ranks on {MPI.Get_processor_name()}; torch {torch.__version__}; float32; {mode}; "
            f"median of {args.repeats} repetitions after {args.warmup} warm-up, each call after an MPI barrier, "
            "slowest rank; ring, gloo and col in turn, the first rotating",
            f"# target: ring no slower than gloo; a small call (col timed: up to {col.format_size(args.col_max)}) "
            f"within 2x of the same col call + {SLACK_US:.0f} us. ring/gloo is a time ratio (below 1: ring faster)",
            f"# all_gather_into_tensor, reduce_scatter_tensor: called as {ALL_GATHER.__name__}, "
            f"{REDUCE_SCATTER.__name__} (torch's current names; the old ones warn on every call)",
            HEADER]


def rows_to_time(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(collective, size) for every row: the barrier once, at the smallest size."""
    return [(c, s) for c in args.collectives for s in (args.sizes[:1] if c == "barrier" else args.sizes)]


def main(argv: list[str] | None = None) -> None:
    """Time every row and print the table (rank 0)."""
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size(), timeout=timedelta(seconds=300))
    groups = {"ring": dist.new_group(backend="ring"), "gloo": dist.group.WORLD}
    rank0 = comm.Get_rank() == 0
    if rank0:
        print("\n".join(header(comm, args)), flush=True)
    rows = []
    for collective, nbytes in rows_to_time(args):
        try:
            row = measure(comm, groups, collective, nbytes, args)
        except Exception as e:   # (every rank alike, as a broken call fails on all: the next row goes on)
            size = "-" if collective == "barrier" else col.format_size(nbytes)
            row = Row(collective, size, math.nan, math.nan, None,
                      f"error: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}")
        rows.append(row)
        if rank0:
            print(line(row), flush=True)
    if rank0:
        print(summary(rows))
    dist.destroy_process_group()


def summary(rows: list[Row]) -> str:
    """How many rows meet each half of the target."""
    timed = [r for r in rows if not r.verdict.startswith(("error", "WRONG"))]
    small = [r for r in timed if r.col_us is not None]
    faster = sum(r.ring_us <= r.gloo_us for r in timed)
    near = sum(r.ring_us <= 2 * r.col_us + SLACK_US for r in small)
    broken = len(rows) - len(timed)
    return (f"# ring no slower than gloo: {faster} of {len(timed)} rows; small calls within 2x col + "
            f"{SLACK_US:.0f} us: {near} of {len(small)}" + (f"; {broken} rows WRONG or failed" if broken else ""))


if __name__ == "__main__":
    main()
