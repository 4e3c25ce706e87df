"""How long an elastic job stops when a rank dies: from the victim's SIGKILL to the survivors' first
completed step in the new world, the median of several runs (tests/programs/elastic_job.py).

    python scripts/elastic_times.py --runs 5                        # n = 4, one host
    python scripts/elastic_times.py --runs 5 --hosts 2,2            # scripts/emulate_hosts.sh (root); "up 2 1gbit" first
"""
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(n: int, hosts: str | None, victim: int) -> float:
    job = [sys.executable, "-m", "tests.programs.elastic_job", "--steps", "200", "--kill", f"{victim}@100"]
    if hosts:
        command = [str(ROOT / "scripts" / "emulate_hosts.sh"), "run", hosts, "--", "-disable-auto-cleanup", *job]
    else:
        command = [str(Path(sys.executable).parent / "mpiexec"), "-disable-auto-cleanup", "-n", str(n), *job]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    killed = float(re.search(r"killed at ([\d.]+)", out).group(1))
    went_on = float(re.search(r"first step after the change done at ([\d.]+)", out).group(1))
    return went_on - killed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("-n", type=int, default=4)
    p.add_argument("--hosts", help="an emulated layout such as 2,2 (n is its sum)")
    p.add_argument("--victim", type=int, default=None, help="the rank killed (default: the last)")
    args = p.parse_args()
    n = sum(map(int, args.hosts.split(","))) if args.hosts else args.n
    times = [one_run(n, args.hosts, n - 1 if args.victim is None else args.victim) for _ in range(args.runs)]
    print(f"kill -> next step ({args.hosts or f'{n} ranks, one host'}): median {statistics.median(times):.3f} s, "
          f"min {min(times):.3f}, max {max(times):.3f} over {len(times)} runs")


if __name__ == "__main__":
    main()
