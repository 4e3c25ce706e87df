"""Issue 25's network measurement: every all-reduce algorithm against MPI's own, side by side in one
launch, with the cost model's prediction for each.

    scripts/emulate_hosts.sh up 2 1gbit                # 2 hosts, each link shaped to 1 Gbit/s
    scripts/emulate_hosts.sh run 2,2 -- python scripts/hosts_bench.py --link 125MB/s,50us --hosts 2x2

For each size, each round times every implementation in turn (so drift hits all alike): MPI's
Allreduce, then the flat ring, halving-doubling (Rabenseifner) and the two-level all-reduce, each
at every ``--segments`` size, and ``col.allreduce`` as users call it (the runtime's choice of
algorithm and segment).
Each iteration starts after a barrier and counts as the slowest rank's time; the table shows
medians of the round medians, busbw as nccl-tests defines it (algbw * 2(n-1)/n), and the
prediction of ``ring.cost.predict`` (this machine's fitted costs on the host, ``--link`` across
hosts) with its error. The algorithms are called directly (``ring.algorithms``), past the
public call's cross-rank check, which the last column includes. Every result is checked
against MPI's.
"""
import argparse

import numpy as np
from mpi4py import MPI

import collectives as col
from bench.model import parse_hosts, parse_link
from collectives.process.startup import world
from collectives.calls.sizes import parse_size
from ring import algorithms, cost
from ring.transport.base import unbounded
from ring_vs_mpi import median_time   # (scripts/, beside this one)


def implementations(comm: MPI.Comm, x: np.ndarray, out: np.ndarray, segments: list[int]) -> dict:
    """name -> (a call that all-reduces x into out, the algorithm and segment the model prices it as)."""
    g, bound = world(), unbounded()   # (no call's deadline applies to the direct calls)
    found = {"mpi": (lambda: comm.Allreduce(x, out), None)}
    for segment in segments:
        elems = segment // x.itemsize
        found[f"ring {segment >> 10}K"] = (lambda e=elems: algorithms.allreduce(g.transport, bound, x, out, "sum", e),
                                            ("ring", segment))
        found[f"halving {segment >> 10}K"] = (
            lambda e=elems: algorithms.allreduce_halving_doubling(g.transport, bound, x, out, "sum", e), ("halving", segment))
        if g.levels is not None:
            found[f"two-level {segment >> 10}K"] = (
                lambda e=elems: algorithms.allreduce_two_level(*g.levels, bound, x, out, "sum", e), ("two-level", segment))
    found["col.allreduce"] = (lambda: col.allreduce(x, out=out), None)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,4M,16M,64M", help="comma-separated byte counts (4M, 64K, ...)")
    parser.add_argument("--segments", default="4M,1M", help="segment sizes to time the two-level path at")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3, help="timed iterations per round")
    parser.add_argument("--link", type=parse_link, help="the network for the predictions, like 125MB/s,50us")
    parser.add_argument("--hosts", type=parse_hosts, help="HxL for the predictions, like 2x2")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    segments = [parse_size(s) for s in args.segments.split(",")]
    col.init()
    if comm.rank == 0:
        print(f"# n={n}, hosts {col.size() // col.local_size()} x {col.local_size()}, float32 sum, "
              f"{MPI.Get_library_version().splitlines()[0]}; medians of {args.rounds} rounds of {args.iters}")
        print(f"{'bytes':>10} {'implementation':>16} {'ms':>9} {'busbw GB/s':>10} {'vs mpi':>7} "
              f"{'model ms':>9} {'error':>7}")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        x = ((np.arange(nbytes // 4) % 97) + comm.rank).astype(np.float32)
        expected = np.empty_like(x)
        comm.Allreduce(x, expected)
        out = np.empty_like(x)
        found = implementations(comm, x, out, segments)
        times: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(args.rounds):
            for name, (fn, _) in found.items():
                times[name].append(median_time(comm, fn, args.iters))
                if not np.array_equal(out, expected):
                    raise SystemExit(f"rank {comm.rank}: {name} disagrees with MPI at {nbytes} bytes")
        if comm.rank == 0:
            mpi = float(np.median(times["mpi"]))
            for name, (_, priced) in found.items():
                t = float(np.median(times[name]))
                line = (f"{nbytes:>10} {name:>16} {t * 1e3:>9.2f} {nbytes / t / 1e9 * 2 * (n - 1) / n:>10.3f} "
                        f"{mpi / t:>7.2f}")
                if priced and args.link and args.hosts:
                    predicted = cost.predict("allreduce", priced[0], n, nbytes, segment_bytes=priced[1],
                                             check=False, hosts=args.hosts, network=args.link)
                    line += f" {predicted * 1e3:>9.2f} {(predicted - t) / t:>+7.0%}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
