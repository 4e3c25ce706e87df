"""A two-rank all-gather as the bench times it (each call after a barrier, the caller's own work
between calls: the output reset, the result checked), three ways side by side in one launch: ours
(``col.allgather(x, out=out)``), MPI's ``Allgather``, and the floor of ours: a flat loop of the same
messages in mpi4py (the check's exchange of 264 bytes, then the rows straight between the arrays, over
persistent requests polled with ``Test``), which no Python frame of the runtime adds to. Rank 0
prints the median microseconds of each per size (the slowest rank's time per call).

    mpiexec -bind-to core -n 2 python scripts/direct_floor.py                      # 4 KiB .. 512 KiB a rank
    mpiexec -bind-to core -n 2 python scripts/direct_floor.py --sizes 131072 --calls 600

What it measured (docs/performance.md, "The round of 2026-11-30, night"), 128 KiB a rank: ours
24.1-24.8 us while the runtime's direct lane ran in five frames, 21.2-21.5 in one function; MPI's
20.3-21.2; the floor 14.8-15.0. Run it from each checkout in turn (``PYTHONPATH=<checkout>``).
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives as col


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 32768, 131072, 524288], help="bytes a rank")
    p.add_argument("--calls", type=int, default=300, help="timed calls of each way per size")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("direct_floor.py: run it on two ranks (mpiexec -n 2)")
    for nbytes in args.sizes:
        times = _one_size(world, nbytes // 4, args.calls)
        if world.rank == 0:
            print(f"{nbytes:>9} B a rank: " + "  ".join(f"{name} {t:7.1f} us" for name, t in times.items()), flush=True)


def _one_size(world: MPI.Comm, count: int, calls: int) -> dict:
    rank, peer = world.rank, 1 - world.rank
    comm = world.Dup()   # (the floor's messages apart from MPI's own collective and the runtime's)
    x, out = np.full(count, rank + 1, np.float32), np.empty(2 * count, np.float32)
    expected = np.repeat(np.float32([1, 2]), count)
    mine, theirs = (out[:count], out[count:]) if rank == 0 else (out[count:], out[:count])
    header, headers_in = np.zeros(264, np.uint8), np.zeros(264, np.uint8)
    check = [comm.Recv_init(headers_in, peer, 8), comm.Send_init(header, peer, 8)]
    rows = [comm.Recv_init(theirs, peer, 9), comm.Send_init(x, peer, 9)]

    def floor() -> None:
        for requests in (check, rows):
            receiving, sending = requests
            receiving.Start()
            sending.Start()
            if requests is rows:
                mine[...] = x
            while not (receiving.Test() and sending.Test()):
                pass

    ways = {"ours": lambda: col.allgather(x, out=out), "MPI": lambda: world.Allgather(x, out), "floor": floor}
    for _ in range(5):
        ways["ours"]()   # (the lane opens and makes its exchange ready)
    medians = {}
    for name, way in ways.items():
        seconds = np.empty(calls)
        for i in range(calls + 20):   # (as bench.timing: the output reset, a one-integer all-reduce for a
            out.fill(-1)              # barrier, the call, the wrong elements counted)
            world.Allreduce(np.zeros(1, np.int32), np.zeros(1, np.int32), op=MPI.MAX)
            began = time.perf_counter()
            way()
            if i >= 20:
                seconds[i - 20] = time.perf_counter() - began
            if np.count_nonzero(out != expected):
                raise SystemExit(f"direct_floor.py: {name} gathered the wrong rows")
        world.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
        medians[name] = float(np.median(seconds)) * 1e6
    for request in check + rows:
        request.Free()
    comm.Free()
    return medians


if __name__ == "__main__":
    main()
