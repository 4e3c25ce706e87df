"""The ring's reduction step against a plain copy of the same buffer, on one process: is reducing a
received segment as cheap as moving it?

    python scripts/reduce_vs_copy.py                  # host memory (numpy)
    python scripts/reduce_vs_copy.py --device cuda    # device memory (cupy), e.g. on the GPU machine

For each size: ``copy`` is ``xp.copyto(dst, src)`` (reads n bytes, writes n); ``reduce`` is
the kernel the ring runs on every received segment, ``ring.arrays.combiner(xp, op)(out,
mine, received)`` (reads 2n, writes n). Each is run ``--calls`` times back to back, then
the device is synchronized; the figure is the median over ``--rounds`` of the time per
call. GB/s counts the bytes each one reads and writes (GB = 1e9). ``reduce/copy`` is the
ratio of times: about 1.5 means the reduction runs at the same memory bandwidth as the copy.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ring import arrays


def per_call(fn, target, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the seconds per call of ``calls`` back-to-back calls of ``fn``."""
    fn()
    arrays.synchronize(target)   # first touch and kernel compilation are not what is measured
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        arrays.synchronize(target)
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--op", default="sum", choices=sorted(arrays.REDUCE_UFUNC_NAMES))
    parser.add_argument("--sizes", default="65536,4194304,67108864", help="comma-separated byte counts")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.device == "cuda":
        import cupy as xp
        where = f"GPU {xp.cuda.runtime.getDeviceProperties(xp.cuda.runtime.getDevice())['name'].decode()}"
    else:
        xp, where = np, "host memory"
    dtype = np.dtype(args.dtype)
    combine = arrays.combiner(xp, args.op)
    print(f"# {where}; {dtype} {args.op}; {args.calls} calls back to back, median of {args.rounds} rounds")
    print(f"{'bytes':>10} {'copy us':>10} {'copy GB/s':>10} {'reduce us':>10} {'reduce GB/s':>11} {'reduce/copy':>11}")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        count = nbytes // dtype.itemsize
        mine = xp.asarray((np.arange(count) % 7).astype(dtype))
        received = xp.asarray((np.arange(count) % 5).astype(dtype))
        out = xp.empty_like(mine)
        copy = per_call(lambda: xp.copyto(out, mine), out, args.calls, args.rounds)
        reduce = per_call(lambda: combine(out, mine, received), out, args.calls, args.rounds)
        expected = arrays.combiner(np, args.op)
        check = np.empty(count, dtype)
        expected(check, arrays.to_host(mine), arrays.to_host(received))
        if not np.array_equal(arrays.to_host(out), check):
            raise SystemExit(f"the reduction of {nbytes} bytes is wrong")
        moved = count * dtype.itemsize
        print(f"{nbytes:>10} {copy * 1e6:>10.1f} {2 * moved / copy / 1e9:>10.1f} {reduce * 1e6:>10.1f} "
              f"{3 * moved / reduce / 1e9:>11.1f} {reduce / copy:>11.2f}")


if __name__ == "__main__":
    main()
