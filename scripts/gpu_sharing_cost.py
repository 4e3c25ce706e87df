"""What a small staged all-reduce costs, step by step, where ranks share one GPU:

    mpiexec -n 2 python scripts/gpu_sharing_cost.py     # two processes on one GPU (the staged path)
    mpiexec -n 1 python scripts/gpu_sharing_cost.py     # the same steps with the GPU to itself

Each line is the median over ``--iters`` of one iteration, every rank in step (a barrier before
each): a tiny kernel then a stream synchronization; a copy of 8 bytes to the host (what staging
does per message); the staged ring's hop by hand (kernel, copy to host, MPI exchange of 8 bytes,
copy back); and ``col.allreduce`` of 2 float32 on the GPU, synchronized. If the hop by hand costs
what the all-reduce costs, the time is the GPU's (two processes' contexts take turns on it), not
the runtime's.
"""
from __future__ import annotations

import argparse
import time

import cupy
import numpy as np
from mpi4py import MPI

import collectives as col


def median_us(fn, iters: int, comm: MPI.Comm) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    slowest = comm.allreduce(float(np.median(times)), op=MPI.MAX)
    return slowest * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=500)
    args = parser.parse_args()
    col.use_local_gpu()
    comm, stream = MPI.COMM_WORLD, cupy.cuda.get_current_stream()
    n, rank = comm.Get_size(), comm.Get_rank()
    x = cupy.arange(2, dtype=cupy.float32)
    host, received = np.empty(2, np.float32), np.empty(2, np.float32)

    def kernel_and_sync():
        x.__iadd__(1)
        stream.synchronize()

    def to_host():
        x.get(out=host)

    def hop():
        x.__iadd__(1)
        x.get(out=host)
        comm.Sendrecv(host, dest=(rank + 1) % n, recvbuf=received, source=(rank - 1) % n)
        x.set(received)
        stream.synchronize()

    def ring_allreduce():
        col.allreduce(x, out=x)
        stream.synchronize()

    rows = [("kernel + synchronize", kernel_and_sync), ("8 B to the host", to_host),
            ("one staged hop by hand", hop), ("col.allreduce of 8 B", ring_allreduce)]
    results = [(name, median_us(fn, args.iters, comm)) for name, fn in rows]
    if rank == 0:
        print(f"# {n} rank(s) on GPU {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; "
              f"transport {col.gpu_transport()}; median of {args.iters}, slowest rank, us")
        for name, us in results:
            print(f"{name:>26}  {us:9.1f}")


if __name__ == "__main__":
    main()
