"""Issue 2's speed check: our ring all-reduce against the MPI library's own Allreduce, side by side.

    mpiexec -n 2 python scripts/ring_vs_mpi.py            # 4 KiB and 64 MiB, float32 sum

For each size the two are timed alternately (so drift hits both alike), several
rounds; each iteration is timed after a barrier and counted as the slowest rank's
time. Prints medians of the round medians, bus bandwidth as nccl-tests defines it
(algbw * 2(n-1)/n), and ring/MPI ratios. Speed lives here, never in the tests.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives as col


def median_time(comm, fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,67108864", help="comma-separated byte counts")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    col.init()
    if comm.rank == 0:
        print(f"# n={n} float32 sum, {MPI.Get_library_version().splitlines()[0]}; median of {args.rounds} rounds")
        print(f"{'bytes':>10} {'ring us':>10} {'mpi us':>10} {'ring busbw':>10} {'mpi busbw':>10} "
              f"{'busbw ratio':>11} {'latency ratio':>13}")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        x = (np.arange(nbytes // 4) % 97 + comm.rank).astype(np.float32)
        ours, theirs = np.empty_like(x), np.empty_like(x)
        iters = max(5, min(2000, (256 << 20) // max(nbytes, 1)))
        ring_t, mpi_t = [], []
        for _ in range(args.rounds):
            ring_t.append(median_time(comm, lambda: col.allreduce(x, out=ours), iters))
            mpi_t.append(median_time(comm, lambda: comm.Allreduce(x, theirs), iters))
        if not np.array_equal(ours, theirs):
            raise SystemExit(f"rank {comm.rank}: ring and MPI disagree at {nbytes} bytes")
        r, m = float(np.median(ring_t)), float(np.median(mpi_t))
        bus = 2 * (n - 1) / n if n > 1 else 1.0
        if comm.rank == 0:
            print(f"{nbytes:>10} {r * 1e6:>10.1f} {m * 1e6:>10.1f} {nbytes / r / 1e9 * bus:>10.2f} "
                  f"{nbytes / m / 1e9 * bus:>10.2f} {m / r:>11.2f} {r / m:>13.2f}")


if __name__ == "__main__":
    main()
