"""What a nonblocking handle costs: blocking calls, async calls waited at once, and the two alternating.

    mpiexec -n 2 python scripts/async_overhead.py              # 4-byte float32 all-reduce
    mpiexec -n 2 python scripts/async_overhead.py --bytes 65536 --rounds 7

Each round times a loop of calls of each pattern, interleaved (blocking, async, alternating,
blocking, ...) so that drift on a shared machine hits them alike; a pattern's time per call
is the slowest rank's loop time over its calls. Prints the median over rounds, side by side,
and each pattern's ratio to the blocking call. The patterns:

* ``blocking``: ``allreduce(x, out=y)``
* ``async+wait``: ``allreduce(x, out=y, async_op=True).wait()``
* ``alternating``: one async call (waited after the next), then one blocking call
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives as col


def blocking(x, y, calls: int) -> None:
    for _ in range(calls):
        col.allreduce(x, out=y)


def async_waited(x, y, calls: int) -> None:
    for _ in range(calls):
        col.allreduce(x, out=y, async_op=True).wait()


def alternating(x, y, calls: int) -> None:
    z = np.empty_like(y)
    for _ in range(calls // 2):
        work = col.allreduce(x, out=z, async_op=True)
        col.allreduce(x, out=y)
        work.wait()


PATTERNS = {"blocking": blocking, "async+wait": async_waited, "alternating": alternating}


def per_call(comm, pattern, x, y, calls: int) -> float:
    comm.Barrier()
    started = time.perf_counter()
    pattern(x, y, calls)
    return comm.allreduce(time.perf_counter() - started, op=MPI.MAX) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4, help="bytes per call (float32)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per pattern per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    x = np.full(max(1, args.bytes // 4), comm.rank + 1.0, np.float32)
    y = np.empty_like(x)
    for pattern in PATTERNS.values():   # warm up: set up, choose algorithms, start the engine thread
        pattern(x, y, 20)
    times = {name: [] for name in PATTERNS}
    for _ in range(args.rounds):
        for name, pattern in PATTERNS.items():
            times[name].append(per_call(comm, pattern, x, y, args.calls))
    if not np.all(y == sum(range(1, comm.size + 1))):
        raise SystemExit(f"rank {comm.rank}: wrong sum")
    if comm.rank == 0:
        base = float(np.median(times["blocking"]))
        print(f"# n={comm.size}, {x.nbytes} B float32 sum, {args.calls} calls x {args.rounds} rounds "
              "(median of rounds, slowest rank)")
        print(f"{'pattern':>12} {'us/call':>9} {'vs blocking':>11}")
        for name, seconds in times.items():
            median = float(np.median(seconds))
            print(f"{name:>12} {median * 1e6:>9.1f} {median / base:>11.2f}")


if __name__ == "__main__":
    main()
