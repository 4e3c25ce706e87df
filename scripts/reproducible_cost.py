"""What ``reproducible=True`` costs: the all-reduce with and without it, side by side, interleaved.

    mpiexec -n 2 python scripts/reproducible_cost.py [--min 4K] [--max 64M] [--sizes 4K,1M,64M] [--dtype float32]
                                                     [--contributions K]

Each size is timed in rounds that alternate the two calls (so that a busy machine slows both),
and the median of each is printed with their ratio, the words per element the grid took (their
dtype: a float where the grid's sums fit its significand, else int64, and how many), and
where the reproducible call's time went, stage by stage (medians over the rounds, rank 0, ms;
``collectives.ops.reproducible.record_stages``): its facts, their exchange and the grid, the
encoding, the all-reduce of the words on the wire and the decoding (with the marks of special
values where there are any), and the rest of the call. The data is standard normal, one
contribution per rank (a different one on each), or ``--contributions K`` of them, whose float
sum the plain call reduces. The wire column says "one rounding" where the call needs no grid
(``ring.reproducible.one_rounding``: two contributions in all, or one).
"""
import argparse
import time

import numpy as np

import collectives as col
from collectives.ops import reproducible as op
from ring import reproducible

#: The stages of ``collectives.ops.reproducible.stage_seconds``, and the rest of the call ("other":
#: checking the arguments, the call's own bookkeeping).
STAGES = ("facts", "grid", "marks", "encode", "wire", "decode", "other")


def parse_size(text: str) -> int:
    """>>> parse_size("64M"), parse_size("4K"), parse_size("100")
    (67108864, 4096, 100)"""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(call) -> float:
    col.barrier()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(parts: list, seconds: float) -> tuple[list, list, dict]:
    """The plain call's seconds on the sum of ``parts`` and the reproducible call's on ``parts``,
    round by round, and the latter's stages."""
    x = np.sum(parts, axis=0, dtype=parts[0].dtype)
    out = np.empty_like(x)
    plain, exact, stages = [], [], {s: [] for s in STAGES}
    rounds = 0
    budget = time.perf_counter() + seconds
    while rounds < 3 or col.allreduce(np.array([time.perf_counter() < budget], np.int8), "min")[0]:
        plain.append(timed(lambda: col.allreduce(x, out=out)))
        seconds: dict = {}
        op.record_stages(seconds)
        exact.append(timed(lambda: col.allreduce(parts, out=out, reproducible=True)))
        op.record_stages(None)
        for s in STAGES[:-1]:
            stages[s].append(seconds.get(s, 0.0))
        stages["other"].append(exact[-1] - sum(seconds.values()))
        rounds += 1
    return plain, exact, stages


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min", type=parse_size, default=4 << 10)
    p.add_argument("--max", type=parse_size, default=64 << 20)
    p.add_argument("--sizes", type=lambda t: [parse_size(s) for s in t.split(",")], default=None,
                   help="these sizes instead of --min to --max by 4x")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--contributions", type=int, default=1, help="contributions on each rank")
    p.add_argument("--seconds", type=float, default=2.0, help="about this long per size (at least 3 rounds)")
    args = p.parse_args()
    rng = np.random.default_rng(col.rank())
    sizes = args.sizes or [args.min << (2 * k) for k in range(64) if args.min << (2 * k) <= args.max]
    if col.rank() == 0:
        print(f"{col.size()} ranks, {args.dtype}, medians (ms); wire: the grid's words per element on the wire; "
              f"then the reproducible call's stages")
        print(f"{'bytes':>10} {'plain':>9} {'reproducible':>13} {'ratio':>6} {'wire':>12} |"
              + "".join(f"{s:>9}" for s in STAGES))
    for size in sizes:
        parts = [rng.standard_normal(size // np.dtype(args.dtype).itemsize).astype(args.dtype)
                 for _ in range(args.contributions)]
        plain, exact, stages = measure(parts, args.seconds)
        every = col.allgather(reproducible.facts(parts)[None])
        g = reproducible.grid(every, parts[0].dtype)
        wire = g.wire_dtype.name + (f"x{g.words}" if g.words > 1 else "")
        if reproducible.one_rounding(every, parts[0].dtype, "sum"):
            wire = "one rounding"
        if col.rank() == 0:
            a, b = np.median(plain) * 1e3, np.median(exact) * 1e3
            print(f"{size:>10} {a:>9.3f} {b:>13.3f} {b / a:>6.2f} {wire:>12} |"
                  + "".join(f"{np.median(stages[s]) * 1e3:>9.3f}" for s in STAGES), flush=True)


if __name__ == "__main__":
    main()
