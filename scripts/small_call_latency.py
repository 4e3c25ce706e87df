"""Small-call latency in a tight loop, ours against MPI's own call side by side: ``col.allreduce(x,
out=out)`` and mpi4py's ``comm.Allreduce(x, out)`` (float32 sum; ``--op allgather``: ``col.allgather(x,
out=out)`` and ``comm.Allgather``; ``--op broadcast``: ``col.broadcast(x)`` and ``comm.Bcast``, root 0),
in alternating rounds of 5000 calls each, so that both see the same load. Rank 0 prints, per size,
the median microseconds per call of each over the rounds and the median of the rounds' ratios
(ours over MPI's).

    mpiexec -bind-to core -n 2 python scripts/small_call_latency.py              # 8 B and 4 KiB
    mpiexec -bind-to core -n 2 python scripts/small_call_latency.py --sizes 8 --rounds 11
    mpiexec -bind-to core -n 2 python scripts/small_call_latency.py --best     # + the fastest batches
    mpiexec -bind-to core -n 2 python scripts/small_call_latency.py --op allgather

``--best`` also prints the fastest of 400 batches of 100 calls (each batch after a barrier, ours and
MPI's alternating): what a call takes when nothing else runs, which a loaded machine's medians
hide (a rank that loses its core for a time slice stalls its peer too).

To compare two commits, run it from each checkout in turn (``PYTHONPATH=<checkout>``), several
times in both orders, and compare the ratios: on a shared 2-core machine the microseconds of one
launch move by half, the ratio much less.
"""
import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives as col

WARMUP = 2000


def per_call(loop, calls: int, comm: MPI.Comm) -> float:
    """Microseconds per call of ``loop(calls)``, started together on every rank (a barrier)."""
    comm.Barrier()
    started = time.perf_counter()
    loop(calls)
    return (time.perf_counter() - started) / calls * 1e6


def best_per_call(loops: list, comm: MPI.Comm, batches: int = 400, calls: int = 100) -> list[float]:
    """The fastest batch's microseconds per call of each of ``loops``, batches alternating."""
    best = [float("inf")] * len(loops)
    for _ in range(batches):
        for i, loop in enumerate(loops):
            best[i] = min(best[i], per_call(loop, calls, comm))
    return best


def _allreduce(x: np.ndarray, out: np.ndarray, comm: MPI.Comm) -> tuple:
    def ours(calls: int) -> None:
        for _ in range(calls):
            col.allreduce(x, out=out)

    def mpis(calls: int) -> None:
        for _ in range(calls):
            comm.Allreduce(x, out)
    return ours, mpis


def _allgather(x: np.ndarray, out: np.ndarray, comm: MPI.Comm) -> tuple:
    def ours(calls: int) -> None:
        for _ in range(calls):
            col.allgather(x, out=out)

    def mpis(calls: int) -> None:
        for _ in range(calls):
            comm.Allgather(x, out)
    return ours, mpis


def _broadcast(x: np.ndarray, out: np.ndarray, comm: MPI.Comm) -> tuple:
    def ours(calls: int) -> None:
        for _ in range(calls):
            col.broadcast(x)

    def mpis(calls: int) -> None:
        for _ in range(calls):
            comm.Bcast(x)
    return ours, mpis


#: Each collective's two loops, ours and MPI's own call, on ``x`` (into ``out``); each call is
#: written in its loop: a function between them would add its cost to both and flatter the ratio.
LOOPS = {"allreduce": _allreduce, "allgather": _allgather, "broadcast": _broadcast}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 4096], help="bytes per call")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5000, help="calls per round")
    parser.add_argument("--best", action="store_true", help="also the fastest of 400 batches of 100 calls")
    parser.add_argument("--op", choices=list(LOOPS), default="allreduce",
                        help="the collective (default: allreduce)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    col.init()
    for nbytes in args.sizes:
        count = nbytes // 4
        x = np.ones(count, np.float32)
        out = np.empty(count * (comm.Get_size() if args.op == "allgather" else 1), np.float32)
        ours, mpis = LOOPS[args.op](x, out, comm)

        ours(WARMUP), mpis(WARMUP)
        rounds = [(per_call(ours, args.calls, comm), per_call(mpis, args.calls, comm)) for _ in range(args.rounds)]
        if comm.Get_rank() == 0:
            ring = statistics.median(r for r, _ in rounds)
            mpi = statistics.median(m for _, m in rounds)
            ratio = statistics.median(r / m for r, m in rounds)
            print(f"{nbytes:>8} B {args.op} ours {ring:6.2f} us  MPI {mpi:6.2f} us  ratio {ratio:5.2f}   "
                  f"(n={comm.Get_size()}, medians of {args.rounds} rounds of {args.calls} calls each; "
                  f"load {os.getloadavg()[0]:.1f})", flush=True)
        if args.best:
            ring, mpi = best_per_call([ours, mpis], comm)
            if comm.Get_rank() == 0:
                print(f"{nbytes:>8} B {args.op} ours {ring:6.2f} us  MPI {mpi:6.2f} us  ratio {ring / mpi:5.2f}   (n="
                      f"{comm.Get_size()}, the fastest of 400 batches of 100 calls; load {os.getloadavg()[0]:.1f})",
                      flush=True)


if __name__ == "__main__":
    main()
