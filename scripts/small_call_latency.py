"""Small-call latency in a tight loop: an 8-byte ``col.allreduce(x, out=out)``, the median (and the
best) of 7 rounds of 5000 calls, in microseconds per call, printed by rank 0.

    mpiexec -bind-to core -n 2 python scripts/small_call_latency.py

To compare two commits, run it from each checkout in turn (``PYTHONPATH=<checkout>``), interleaved,
several times in both orders: one run's spread on a shared 2-core machine is several microseconds.
"""
import statistics
import time

import numpy as np

import collectives as col

WARMUP, ROUNDS, CALLS = 2000, 7, 5000


def main() -> None:
    x, out = np.ones(2, np.float32), np.empty(2, np.float32)
    for _ in range(WARMUP):
        col.allreduce(x, out=out)
    rounds = []
    for _ in range(ROUNDS):
        col.barrier()
        started = time.perf_counter()
        for _ in range(CALLS):
            col.allreduce(x, out=out)
        rounds.append((time.perf_counter() - started) / CALLS * 1e6)
    if col.rank() == 0:
        print(f"{statistics.median(rounds):.2f} {min(rounds):.2f}   # us per call: median, best of {ROUNDS} rounds")


if __name__ == "__main__":
    main()
