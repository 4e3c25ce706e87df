"""What one message each way between two ranks costs, by its size: where the MPI library stops
sending eagerly (MPICH: 8 KiB between two ranks of a host, `docs/performance.md`), which the
runtime's small calls, the signature in front of the data, cross 257 bytes sooner than the data
alone. Persistent requests started and polled by ``Test`` in a flat loop, each size after a
barrier; rank 0 prints the median microseconds per exchange.

    mpiexec -bind-to core -n 2 python scripts/message_sizes.py
    mpiexec -bind-to core -n 2 python scripts/message_sizes.py --sizes 8191 8192 8449

Example (the 2-core AMD VM, MPICH 5.0.2): 8100 B 1.8 us, 8191 B 2.6, 8192 B 3.9-4.9.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI


def exchange_time(comm: MPI.Comm, nbytes: int, calls: int) -> float:
    """Median microseconds of one exchange of ``nbytes`` each way with the other rank."""
    peer = 1 - comm.rank
    out, into = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    requests = [comm.Recv_init(into, peer, 5), comm.Send_init(out, peer, 5)]
    seconds = np.empty(calls)
    for i in range(calls + 50):
        comm.Barrier()
        began = time.perf_counter()
        for request in requests:
            request.Start()
        while not (requests[0].Test() and requests[1].Test()):
            pass
        if i >= 50:
            seconds[i - 50] = time.perf_counter() - began
    for request in requests:
        request.Free()
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)   # (the slower rank's time)
    return float(np.median(seconds)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8000, 8191, 8192, 8449, 12288, 16384, 65536],
                   help="message sizes in bytes")
    p.add_argument("--calls", type=int, default=2000, help="timed exchanges per size")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("message_sizes.py: run it on two ranks (mpiexec -n 2)")
    for nbytes in args.sizes:
        us = exchange_time(comm, nbytes, args.calls)
        if comm.rank == 0:
            print(f"{nbytes:>9} B  {us:6.2f} us", flush=True)


if __name__ == "__main__":
    main()
