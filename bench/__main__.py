"""Bandwidth of our ring collectives against the MPI library's own and torch's gloo, side by side,
nccl-tests style.

    mpirun -n 2 python -m bench                        # allreduce, float32, sum, 8 B .. 256 MiB
    mpirun -n 4 python -m bench --op allgather --max-bytes 64M --json ag.json --plot ag.png
    mpirun -n 2 python -m bench --min-bytes 4K --max-bytes 4K --iters 3000   # one size, many iterations

For every size each implementation runs in a pass of its own on the same buffers
(gloo where torch is installed; --no-gloo leaves it out), so none disturbs another; each
call follows a barrier and counts as the slowest rank's time; the table shows
the median. busbw is algbw (bytes / time) times what each link carries, as
nccl-tests defines it: 2(n-1)/n for allreduce, (n-1)/n for reduce_scatter and
allgather, 1 for broadcast. #wrong counts the elements, over all ranks, that
differ from the exact result in the worst iteration; any wrong element makes
the exit status 1. Only rank 0 prints.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import traceback
from types import ModuleType
from typing import Any, Callable

import mpi4py

# The flags are checked before MPI starts (a usage error must not wait for it): importing mpi4py's
# MPI, which the bench's modules do, then starts nothing; col.init() starts it, once they are good.
mpi4py.rc.initialize = False

import collectives as col  # noqa: E402  (first: under srun it chooses MPI's network before MPI's module loads)
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from cmdline.cores import THREAD_VARIABLES, usable_cpus  # noqa: E402
from cmdline.parser import INTERRUPTED, launch_note  # noqa: E402
from bench import model  # noqa: E402
from bench.arguments import check_root, parse_args  # noqa: E402
from bench.cases import Case  # noqa: E402
from bench.gloo import Gloo  # noqa: E402
from bench.report import GB, Row, plot, table_header, table_line, write_csv, write_json  # noqa: E402
from bench.sizes import format_size, sweep  # noqa: E402
from bench.timing import copy_bandwidth, default_iterations, time_each  # noqa: E402
from cmdline.interrupt import stop_together  # noqa: E402
from cmdline.memory import available_memory, gib  # noqa: E402

def _gpu(comm: MPI.Comm, impls: list[str]) -> tuple[ModuleType, Any, dict]:
    """For --device cuda: cupy with this rank's GPU current, NCCL's own communicator (if timed)
    and what to report about them. Every rank reaches the same verdict, so none is left waiting."""
    import cupy
    from cupy.cuda import nccl

    try:
        gpu = col.use_local_gpu()
        communicator = col.nccl_communicator() if "nccl" in impls else None   # (NCCL on every rank, or none)
    except col.CollectiveError as e:
        if comm.Get_rank() == 0:
            hint = " (--impl ring times the ring alone)" if "NCCL cannot" in str(e) else ""
            print(f"python -m bench: error: --device cuda: {e}{hint}", file=sys.stderr, flush=True)
        raise SystemExit(2) from e
    facts = {"gpu": cupy.cuda.runtime.getDeviceProperties(gpu)["name"].decode(),
             "cupy": cupy.__version__, "nccl": str(nccl.get_version()), "gpu_transport": col.gpu_transport()}
    return cupy, communicator, facts


def environment(comm: MPI.Comm, device: str) -> dict:
    """Where these figures come from (printed, and written into the JSON and CSV)."""
    settings = col.settings()
    hosts = sorted(set(comm.allgather(MPI.Get_processor_name())))
    return {
        "ranks_per_host": comm.allreduce(col.local_size(), op=MPI.MAX),
        "usable_cpus": usable_cpus(comm),
        "device": device,
        "n": comm.Get_size(),
        "hosts": ",".join(hosts),
        "mpi_library": " ".join(MPI.Get_library_version().split("\n")[0].split()),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus_per_host": os.cpu_count(),
        "threads": " ".join(f"{v}={os.environ.get(v, 'unset')}" for v in THREAD_VARIABLES),
        "segment_bytes": settings.segment_bytes,
        "small_bytes": settings.small_bytes,
        "check": settings.check,
        "algorithm": settings.algorithm,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:]),
    }


def _print_header(env: dict, args: argparse.Namespace) -> None:
    hosts = env["hosts"].split(",")
    print(f"# {env['command']}")
    print(f"# {env['n']} ranks on {len(hosts)} host(s) ({env['hosts']}), {env['cpus_per_host']} cpus per host; "
          f"{env['mpi_library']}; mpi4py {env['mpi4py']}; numpy {env['numpy']}; python {env['python']}")
    if env["ranks_per_host"] > env["usable_cpus"]:
        print(f"# warning: {env['ranks_per_host']} ranks share {env['usable_cpus']} usable cpus on a host: every "
              "rank waiting for another takes a core it needs, so these times measure the oversubscription "
              "more than the collectives")
    chosen = "the cost model's choice per size" if env["algorithm"] == "auto" else "forced"
    print(f"# ring: algorithm {env['algorithm']} ({chosen}), segment "
          f"{format_size(env['segment_bytes']) if env['segment_bytes'] else 'default (4M on a host, 1M across hosts)'}, "
          f"recursive doubling at most {format_size(env['small_bytes'])}, "
          f"cross-rank check {'on' if env['check'] else 'off'}; "
          f"{env['threads']}")
    iters = f"{args.iters} iterations" if args.iters else "iterations (about 1 GiB per size, 10 to 1000)"
    impls = ", ".join(args.impl[:-1]) + " and " + args.impl[-1] if len(args.impl) > 1 else args.impl[0]
    print(f"# each call after a barrier, slowest rank, median over {iters} after warm-up; {impls} each in a pass "
          "of its own at each size")
    if "gloo" in env:
        print(f"# {env['gloo']}")
    elif args.gloo_note:
        print(f"# note: gloo column omitted: {args.gloo_note}")
    if env["device"] == "cuda":
        print(f"# GPU {env['gpu']}; cupy {env['cupy']}; NCCL {env['nccl']}; "
              f"GPU transport {env['gpu_transport']}")
        print(f"# device copy reference (cupy.copyto of 64M, rank 0's GPU): {env['memcpy_gbps']:.2f} GB/s")
    else:
        print(f"# memcpy reference (np.copyto of 64M, one process): {env['memcpy_gbps']:.2f} GB/s")


def run(args: argparse.Namespace, comm: MPI.Comm) -> int:
    rank0 = comm.Get_rank() == 0
    env = environment(comm, args.device)
    xp, nccl_comm = np, None
    if args.device == "cuda":
        xp, nccl_comm, facts = _gpu(comm, args.impl)
        env.update(facts)
    env["memcpy_gbps"] = copy_bandwidth(comm, xp=xp) / GB
    sizes = sweep(args.min_bytes, args.max_bytes, args.factor)
    _refuse_what_does_not_fit(comm, env, sizes[-1])
    gloo = Gloo(comm) if "gloo" in args.impl else None
    if gloo:
        env.update(gloo=gloo.describe(), torch=gloo.version)
    estimate = _estimate(args, comm, (xp, nccl_comm, gloo), sizes)
    if rank0:
        _print_header(env, args)
        note = launch_note("python -m bench")
        if note:
            print(f"# note: {note}")
        print(_duration(sizes, args, estimate))
        print("\n".join(table_header(args.impl, comm.Get_size())), flush=True)
    rows: list[Row] = []
    skipped: list[int] = []
    began = time.perf_counter()
    try:
        with stop_together():
            _sweep(args, comm, sizes, (xp, nccl_comm, gloo), env, rows, skipped)
    except KeyboardInterrupt:
        if gloo:
            gloo.close()
        if rank0:
            _write(args, env, rows, plot_too=True)
            written = ", ".join(p for p in (args.json, args.csv, args.plot) if p)
            print(f"# interrupted (Ctrl-C or SIGTERM) after {len(rows) // len(args.impl)} of {len(sizes)} sizes"
                  + (f"; the rows so far are in {written}" if written and rows else ""), flush=True)
        return INTERRUPTED
    if gloo:
        gloo.close()
    wrong = sum(r.wrong for r in rows)
    if rank0:
        print(f"# sweep took {_minutes(time.perf_counter() - began)} (estimated {_minutes(estimate)})")
        _summarize(args, env, rows, skipped, wrong)
    return 1 if wrong else 0


def _summarize(args: argparse.Namespace, env: dict, rows: list[Row], skipped: list[int], wrong: int) -> None:
    """The lines under the table (rank 0), and the files with every row."""
    if skipped:
        print(f"# skipped {', '.join(map(str, skipped))} B: less than one element per rank")
    for impl in args.impl:
        mine = [r.busbw for r in rows if r.impl == impl]
        print(f"# {impl}: average busbw {np.mean(mine) if mine else 0:.3f} GB/s over {len(mine)} sizes")
    print(f"# #wrong: {wrong} " + ("(every result exact)" if not wrong else "-- RESULTS ARE WRONG"))
    _write(args, env, rows, plot_too=True)


def _sweep(args: argparse.Namespace, comm: MPI.Comm, sizes: list[int], libraries: tuple[ModuleType, Any, Any],
           env: dict, rows: list[Row], skipped: list[int]) -> None:
    """Time every size, printing (rank 0) and writing each row as it is done; ``rows`` and
    ``skipped`` grow in place, so that an interruption keeps what was done. ``libraries``: the
    array module, NCCL's communicator and the gloo group (None where not timed)."""
    xp, nccl_comm, gloo = libraries
    for nbytes in sizes:
        case = Case(comm, args.op, args.dtype, args.redop, nbytes, args.root, xp, nccl_comm, gloo=gloo)
        if case.count == 0:
            skipped.append(nbytes)
            continue
        iters, warmup = _iterations(args, case.nbytes)
        timings = time_each(comm, case, args.impl, iters, warmup, args.plant_error)
        these = [Row.of(case, impl, timings[impl]) for impl in args.impl]
        rows += these
        if comm.Get_rank() == 0:
            print(table_line(these), flush=True)
            _write(args, env, rows, plot_too=False)   # a row is on disk as soon as it is printed
        del case


def _write(args: argparse.Namespace, env: dict, rows: list[Row], plot_too: bool) -> None:
    """The JSON and CSV files with every row so far; the plot too when asked (it is slower)."""
    if args.json:
        write_json(args.json, env, rows)
    if args.csv:
        write_csv(args.csv, env, rows)
    if plot_too and args.plot and rows:
        plot(args.plot, env, rows)


#: Buffers a case and its calls hold at once, in units of its size: input, output, expected result,
#: the ring's new result array, the comparison's temporaries.
_BUFFERS_PER_CASE = 5


def _refuse_what_does_not_fit(comm: MPI.Comm, env: dict, largest: int) -> None:
    """Exit 2 on every rank (rank 0 says why) if the largest size cannot fit in a host's memory."""
    need = env["ranks_per_host"] * _BUFFERS_PER_CASE * largest
    available = available_memory()
    short = comm.allreduce(int(available is not None and need > available), op=MPI.MAX)
    if short:
        if comm.Get_rank() == 0:
            print(f"python -m bench: error: --max-bytes {format_size(largest)} needs about {gib(need)} of "
                  f"memory on a host ({env['ranks_per_host']} ranks x {_BUFFERS_PER_CASE} buffers), more than a "
                  "host has available" + (f" ({gib(available)} here)" if available else "")
                  + "; give a smaller --max-bytes", file=sys.stderr, flush=True)
        raise SystemExit(2)


#: The estimate times each implementation's calls at the sweep's smallest size and at its largest up
#: to this one: past the per-call overheads, yet well under a second a call.
_CALIBRATION_BYTES = 16 << 20
_CALIBRATION_ITERS = 5


def _iterations(args: argparse.Namespace, nbytes: int) -> tuple[int, int]:
    """(timed, warm-up) iterations of each implementation at ``nbytes``."""
    iters = args.iters or default_iterations(nbytes)
    return iters, args.warmup if args.warmup is not None else max(1, iters // 10)


def _per_iteration(args: argparse.Namespace, comm: MPI.Comm, libraries: tuple[ModuleType, Any, Any],
                   nbytes: int) -> np.ndarray:
    """The seconds the sweep spends at ``nbytes`` on: building the case; then for each implementation,
    its first iteration (fresh buffers: page faults) and a later one (reset, barrier, call, check; the
    median of a few, as a busy machine's stalls come and go). The slowest rank's."""
    xp, nccl_comm, gloo = libraries

    def timed(work: Callable[[], Any]) -> float:
        began = time.perf_counter()
        work()
        return time.perf_counter() - began
    case: list[Case] = []
    seconds = [timed(lambda: case.append(Case(comm, args.op, args.dtype, args.redop, nbytes, args.root, xp,
                                               nccl_comm, gloo=gloo)))]
    for impl in args.impl:
        def one() -> None:
            time_each(comm, case[0], [impl], 1, 0)
        seconds += [timed(one), float(np.median([timed(one) for _ in range(_CALIBRATION_ITERS)]))]
    slowest = np.array(seconds)
    comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    return slowest


def _estimate(args: argparse.Namespace, comm: MPI.Comm, libraries: tuple[ModuleType, Any, Any],
              sizes: list[int]) -> float:
    """Seconds the sweep of ``sizes`` will take: every case built and every iteration run, each timed at
    the smallest size and at the largest up to _CALIBRATION_BYTES, and taken as linear in the size
    between and beyond them (a second or so of calls, on every rank)."""
    small = max(sizes[0], np.dtype(args.dtype).itemsize * comm.Get_size())   # (at least an element per rank)
    large = max([s for s in sizes if s <= _CALIBRATION_BYTES] + [small])
    _per_iteration(args, comm, libraries, small)   # (untimed: what happens once, like gloo's connections)
    at_small = _per_iteration(args, comm, libraries, small)
    at_large = _per_iteration(args, comm, libraries, large) if large > small else at_small
    total = 0.0
    for nbytes in sizes:
        share = (nbytes - small) / (large - small) if large > small else 0.0
        built, *calls = np.maximum(at_small + share * (at_large - at_small), 0.0)
        total += built + sum(first + (sum(_iterations(args, nbytes)) - 1) * later
                             for first, later in zip(calls[::2], calls[1::2]))
    return total


def _duration(sizes: list[int], args: argparse.Namespace, estimate: float) -> str:
    """The header's line on the sweep: its sizes, the bytes its calls move, and how long it will take."""
    moved = sum(sum(_iterations(args, nbytes)) * nbytes * len(args.impl) for nbytes in sizes)
    return (f"# sweep: {len(sizes)} sizes, {gib(moved)} moved in all; about {_minutes(estimate)}, from calls "
            "timed at two sizes as the sweep makes them (Ctrl-C stops it, keeping the rows so far)")


def _minutes(seconds: float) -> str:
    """``seconds`` for a reader.

    >>> _minutes(2.345), _minutes(463.2)
    ('2.3 s', '7 min 43 s')
    """
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench [flags]``: the sweep (or the cost model's fit, with --model); the exit status
    (0: every result exact; 1: a wrong one; 2: a usage error, said before MPI starts where it can be)."""
    args = parse_args(argv, col.about.launched_size(), __doc__.split("\n\n")[0])
    comm = MPI.COMM_WORLD
    try:
        col.init()   # (MPI starts here, bounded by the runtime's timeout)
        check_root(args, comm.Get_size())
        return model.run(args, comm) if args.model else run(args, comm)
    except KeyboardInterrupt:   # outside the sweep: nothing to keep
        return INTERRUPTED
    except Exception:   # one rank failing alone must not leave the others waiting in a barrier
        sys.stderr.write(f"rank {comm.Get_rank()}: {traceback.format_exc()}")   # (one write: the ranks share the stream)
        sys.stderr.flush()
        comm.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
