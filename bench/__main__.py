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
import traceback
from types import ModuleType
from typing import Any

import mpi4py
import numpy as np
from mpi4py import MPI

import collectives as col
from cmdline.cores import THREAD_VARIABLES
from cmdline.parser import INTERRUPTED, launch_note
from bench import model
from bench.arguments import parse_args
from bench.cases import Case
from bench.gloo import Gloo
from bench.report import GB, Row, plot, table_header, table_line, write_csv, write_json
from bench.sizes import format_size, sweep
from bench.timing import copy_bandwidth, default_iterations, time_each
from cmdline.interrupt import stop_together
from cmdline.memory import available_memory, gib

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
    cpus = {}   # per host, the cpus its ranks may run on together (a rank bound to one core shares it with none)
    for host, mine in comm.allgather((MPI.Get_processor_name(), os.sched_getaffinity(0))):
        cpus.setdefault(host, set()).update(mine)
    return {
        "ranks_per_host": comm.allreduce(col.local_size(), op=MPI.MAX),
        "usable_cpus": min(len(c) for c in cpus.values()),
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
    col.init()
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
    if rank0:
        _print_header(env, args)
        note = launch_note("python -m bench")
        if note:
            print(f"# note: {note}")
        print(_duration(sizes, args, env))
        print("\n".join(table_header(args.impl, comm.Get_size())), flush=True)
    rows: list[Row] = []
    skipped: list[int] = []
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
        iters = args.iters or default_iterations(case.nbytes)
        warmup = args.warmup if args.warmup is not None else max(1, iters // 10)
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


def _duration(sizes: list[int], args: argparse.Namespace, env: dict) -> str:
    """A lower bound on the sweep's time: every byte the timed and warm-up calls move, at the
    memory-copy rate of one process (collectives between processes are slower than that)."""
    moved = 0
    for nbytes in sizes:
        iters = args.iters or default_iterations(nbytes)
        warmup = args.warmup if args.warmup is not None else max(1, iters // 10)
        moved += (iters + warmup) * nbytes * len(args.impl)
    seconds = moved / (env["memcpy_gbps"] * GB) if env["memcpy_gbps"] else 0
    return (f"# sweep: {len(sizes)} sizes, {gib(moved)} moved in all; at the memcpy rate that takes at "
            f"least {seconds:.0f} s (Ctrl-C stops it, keeping the rows so far)")


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    args = parse_args(argv, comm.Get_size(), __doc__.split("\n\n")[0])
    try:
        return model.run(args, comm) if args.model else run(args, comm)
    except KeyboardInterrupt:   # outside the sweep: nothing to keep
        return INTERRUPTED
    except Exception:   # one rank failing alone must not leave the others waiting in a barrier
        print(f"rank {comm.Get_rank()}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        comm.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
