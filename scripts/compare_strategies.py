"""All-reduce against parameter servers, on the same model and data: one figure, one table.

    python scripts/compare_strategies.py --out docs/strategies.png --table bench/results/strategies.txt

Runs ``python -m trainer`` (the digits, 20 epochs, unless other trainer flags follow ``--``)
at n = 3 and 4 with all-reduce, synchronous parameter servers (``--max-staleness 0``) and
asynchronous ones (unbounded), each under its own ``mpiexec``, and draws test accuracy
against training time and against epochs. Training time is the sum of the epochs' times
(samples / samples per second): the chief's evaluation between epochs is left out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.worlds import mpiexec  # noqa: E402  (the launcher that belongs to this Python's MPI)

STRATEGIES = {"all-reduce": [], "PS synchronous (K=0)": ["--strategy", "ps", "--max-staleness", "0"],
              "PS asynchronous": ["--strategy", "ps"]}


def run(n: int, flags: list[str], metrics: Path) -> list[dict]:
    command = [*mpiexec(), "-n", str(n), sys.executable, "-m", "trainer", *flags, "--metrics", str(metrics)]
    subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the figure (PNG)")
    parser.add_argument("--table", type=Path, help="also write the table to this file")
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the table shows medians, the "
                                                                "figure the run of median training time")
    parser.add_argument("trainer_flags", nargs="*", help="after --: flags for python -m trainer")
    args = parser.parse_args()
    every: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):   # interleaved, so that a noisy moment spreads over all
            for n in args.ranks:
                for label, flags in STRATEGIES.items():
                    every.setdefault((label, n), []).append(
                        run(n, [*flags, *args.trainer_flags], Path(scratch) / f"{n}-{len(every)}-{repeat}.jsonl"))
    runs = {key: median_run(records) for key, records in every.items()}
    lines = [f"# python scripts/compare_strategies.py {' '.join(sys.argv[1:])}",
             f"# {args.repeats} runs of each, interleaved; the run of median training time is shown, its samples/s "
             "the median over its epochs",
             f"{'strategy':22} {'n':>2} {'test acc':>8} {'best':>6} {'samples/s':>10} {'train s':>8} "
             f"{'staleness':>9} {'max':>4}  (train s of each run)"]
    for (label, n), records in runs.items():
        seconds = training_seconds(records)[-1]
        speed = sorted(r["samples_per_sec"] for r in records)[len(records) // 2]
        each = " ".join(f"{training_seconds(other)[-1]:.2f}" for other in every[(label, n)])
        lines.append(f"{label:22} {n:>2} {records[-1]['test_accuracy']:8.2%} "
                     f"{max(r['test_accuracy'] for r in records):6.2%} {speed:10.0f} {seconds:8.2f} "
                     f"{sum(r.get('staleness_mean', 0) for r in records) / len(records):9.2f} "
                     f"{max(r.get('staleness_max', 0) for r in records):>4}  ({each})")
    print("\n".join(lines))
    if args.table:
        args.table.write_text("\n".join(lines) + "\n")
    draw(runs, args.out)


def median_run(runs: list[list[dict]]) -> list[dict]:
    """The run whose training time is the median of ``runs``."""
    return sorted(runs, key=lambda records: training_seconds(records)[-1])[len(runs) // 2]


def training_seconds(records: list[dict]) -> list[float]:
    """The training time at the end of each epoch: its steps times its time per step, summed."""
    elapsed, seconds, step = [], 0.0, 0
    for r in records:
        seconds += r["step_time"] * (r["step"] - step)
        elapsed.append(seconds)
        step = r["step"]
    return elapsed


def draw(runs: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    styles = {label: style for label, style in zip(STRATEGIES, ("-", "--", ":"))}
    colors = {}
    for (label, n), records in runs.items():
        color = colors.setdefault(n, f"C{len(colors)}")
        elapsed = training_seconds(records)
        accuracy = [100 * r["test_accuracy"] for r in records]
        name = f"{label}, n={n}"
        by_time.plot(elapsed, accuracy, styles[label], color=color, marker=".", label=name)
        by_epoch.plot([r["epoch"] for r in records], accuracy, styles[label], color=color, marker=".", label=name)
    by_time.set(xlabel="training time (s, evaluation left out)", ylabel="test accuracy (%)", title="against time")
    by_epoch.set(xlabel="epoch", title="against epochs")
    by_epoch.legend(fontsize=8, loc="lower right")
    for axes in (by_time, by_epoch):
        axes.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"figure written to {path}")


if __name__ == "__main__":
    main()
