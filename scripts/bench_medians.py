"""Our time over MPI's, per collective and size, as the median of several launches of the bench.

    python scripts/bench_medians.py                       # n=2, 3 launches, 8 B .. 4 MiB, every collective
    python scripts/bench_medians.py --launches 5 --max-bytes 64M --ops allreduce

Each launch is ``mpiexec -n N python -m bench --op OP --json ...`` (ours and MPI's interleaved on
the same buffers, each call after a barrier, the slowest rank's time, the median over the
iterations); this prints, per size, the median over launches of each time and of the ratio
(ours / MPI's: below 1 we are faster) and of the two bus bandwidths.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

import collectives as col

OPS = col.table.SIZED   # the bench's collectives (bench.cases.OPS, which would start MPI here)


def launch(n: int, op: str, max_bytes: str, path: str) -> list[dict]:
    """One bench run; its rows."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    subprocess.run([mpiexec, "-n", str(n), sys.executable, "-m", "bench", "--op", op, "--max-bytes", max_bytes,
                    "--json", path], check=True, timeout=1800, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)["rows"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default: 2)")
    parser.add_argument("--launches", type=int, default=3, help="bench launches per collective (default: 3)")
    parser.add_argument("--max-bytes", default="4M", help="largest size (default: 4M)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    args = parser.parse_args()
    print(f"# python scripts/bench_medians.py -n {args.n} --launches {args.launches} --max-bytes {args.max_bytes} "
          f"--ops {' '.join(args.ops)}")
    with tempfile.TemporaryDirectory() as scratch:
        for op in args.ops:
            times: dict = defaultdict(lambda: defaultdict(list))   # bytes -> impl -> [seconds per launch]
            busbw: dict = defaultdict(lambda: defaultdict(list))
            for k in range(args.launches):
                for row in launch(args.n, op, args.max_bytes, os.path.join(scratch, f"{op}{k}.json")):
                    times[row["bytes"]][row["impl"]].append(row["time_us"])
                    busbw[row["bytes"]][row["impl"]].append(row["busbw"])
            print(f"# {op}, n={args.n}: medians over {args.launches} launches")
            print(f"# {'bytes':>9} {'ours (us)':>10} {'MPI (us)':>10} {'ours/MPI':>9} {'busbw ours':>11} "
                  f"{'busbw MPI':>10} (GB/s)")
            for nbytes, by in sorted(times.items()):
                ratios = [a / b for a, b in zip(by["ring"], by["mpi"])]
                print(f"  {nbytes:>9} {statistics.median(by['ring']):10.1f} "
                      f"{statistics.median(by['mpi']):10.1f} {statistics.median(ratios):9.2f} "
                      f"{statistics.median(busbw[nbytes]['ring']):11.2f} {statistics.median(busbw[nbytes]['mpi']):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
