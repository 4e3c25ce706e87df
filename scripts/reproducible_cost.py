"""What ``reproducible=True`` costs: the all-reduce with and without it, side by side, interleaved.

    mpiexec -n 2 python scripts/reproducible_cost.py [--min 4K] [--max 64M] [--dtype float32]

Each size is timed in rounds that alternate the two calls (so that a busy machine slows both),
and the median of each is printed with their ratio, and the words per element the grid took.
The data is standard normal, one contribution per rank (a different one on each).
"""
import argparse
import time

import numpy as np

import collectives as col
from ring import reproducible


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(call) -> float:
    col.barrier()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min", type=parse_size, default=4 << 10)
    p.add_argument("--max", type=parse_size, default=64 << 20)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seconds", type=float, default=2.0, help="about this long per size (at least 3 rounds)")
    args = p.parse_args()
    rng = np.random.default_rng(col.rank())
    if col.rank() == 0:
        print(f"{col.size()} ranks, {args.dtype}, medians (ms); words: int64 words per element on the wire")
        print(f"{'bytes':>10} {'plain':>9} {'reproducible':>13} {'ratio':>6} {'words':>6}")
    size = args.min
    while size <= args.max:
        x = rng.standard_normal(size // np.dtype(args.dtype).itemsize).astype(args.dtype)
        out = np.empty_like(x)
        plain, exact = [], []
        rounds = 0
        budget = time.perf_counter() + args.seconds
        while rounds < 3 or col.allreduce(np.array([time.perf_counter() < budget], np.int8), "min")[0]:
            plain.append(timed(lambda: col.allreduce(x, out=out)))
            exact.append(timed(lambda: col.allreduce(x, out=out, reproducible=True)))
            rounds += 1
        words = reproducible.grid(col.allgather(reproducible.facts([x])[None]), x.dtype).words
        if col.rank() == 0:
            a, b = np.median(plain) * 1e3, np.median(exact) * 1e3
            print(f"{size:>10} {a:>9.3f} {b:>13.3f} {b / a:>6.2f} {words:>6}", flush=True)
        size *= 4


if __name__ == "__main__":
    main()
