"""What one small all-reduce of a cupy array costs the host, counted: the Python function calls
(cProfile) of ``col.allreduce(x, out=out)`` on 2 float32 at one rank, the functions that take the
most time, and the medians of that call, of the same call on numpy arrays, of one trivial kernel
launch and of a stream synchronization, for scale. On a GPU machine:

    python scripts/gpu_call_profile.py          # (one rank; mpiexec not needed)
"""
from __future__ import annotations

import cProfile
import pstats
import timeit

import cupy
import numpy as np

import collectives as col

CALLS = 2000


def median_us(fn, number: int = 200, repeat: int = 15) -> float:
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat))) / number * 1e6


def main() -> None:
    col.use_local_gpu()
    stream = cupy.cuda.get_current_stream()
    x, out = cupy.ones(2, cupy.float32), cupy.empty(2, cupy.float32)
    hx, hout = np.ones(2, np.float32), np.empty(2, np.float32)
    for _ in range(100):
        col.allreduce(x, out=out)
    stream.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        col.allreduce(x, out=out)
    profile.disable()
    stream.synchronize()
    stats = pstats.Stats(profile)
    print(f"# transport {col.gpu_transport()}: {stats.total_calls / CALLS:.0f} Python function calls per "
          f"allreduce of 8 B on the GPU")
    print(f"allreduce, cupy, queued:          {median_us(lambda: col.allreduce(x, out=out)):7.1f} us")
    stream.synchronize()
    print(f"allreduce, numpy:                 {median_us(lambda: col.allreduce(hx, out=hout)):7.1f} us")
    print(f"one kernel launch (x + 0, queued): {median_us(lambda: cupy.add(x, 0, out=out)):7.1f} us")
    print(f"stream synchronize (idle stream):  {median_us(stream.synchronize):7.1f} us")
    stats.sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
