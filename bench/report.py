"""What the bench writes: the nccl-tests style table, JSON, CSV and the bandwidth plot.

One :class:`Row` per implementation and size. The table puts the rows of one
size on one line, implementations side by side, then ours over each library's busbw:

    #       size        count     type  redop |  ring: time   algbw   busbw  #wrong |  ...  |  ring/mpi | ring/gloo
    #        (B)   (elements)                 |        (us)  (GB/s)  (GB/s)         |  ...  |     busbw |     busbw
        67108864     16777216  float32    sum |     13486.4    4.98    4.98       0 |  ...  |      2.53 |      1.87
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from bench.cases import COMPRESSED, REDUCING, Case, bus_factor
from bench.sizes import format_size
from bench.timing import Timing

GB = 1e9   # nccl-tests' GB/s are 10**9 bytes per second


@dataclass(frozen=True)
class Row:
    """One implementation at one size (the JSON and CSV record)."""
    impl: str
    op: str
    dtype: str
    redop: str
    bytes: int
    count: int
    n: int
    time_us: float
    algbw: float      # GB/s: bytes / time
    busbw: float      # GB/s: algbw * bus_factor(op, n)
    wrong: int

    @classmethod
    def of(cls, case: Case, impl: str, timing: Timing) -> "Row":
        algbw = case.nbytes / timing.seconds / GB if timing.seconds > 0 else 0.0
        redop = case.redop if case.op in REDUCING else "none"   # as nccl-tests shows it
        return cls(impl, case.op, case.dtype.name, redop, case.nbytes, case.count, case.n,
                   timing.seconds * 1e6, algbw, algbw * bus_factor(case.op, case.n), timing.wrong)


def table_header(impls: list[str], n: int = 2) -> list[str]:
    """The two header lines of the table for these implementations on ``n`` ranks. The last
    columns are ours over each library's busbw; on one rank, where busbw is 0 by definition, the
    same number is called what it is there: the speed ratio (the library's time over ours)."""
    first = f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6}"
    second = f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6}"
    for impl in impls:
        first += f" | {impl + ': time':>11} {'algbw':>7} {'busbw':>7} {'#wrong':>7}"
        second += f" | {'(us)':>11} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}"
    for native in _natives(impls):
        first += f" | {'ring/' + native:>9}"
        second += f" | {'busbw' if n > 1 else 'speed':>9}"
    for compressed in _compressed(impls):
        first += f" | {compressed[5:] + '/ring':>9}"
        second += f" | {'busbw' if n > 1 else 'speed':>9}"
    return [first, second]


def table_line(rows: list[Row]) -> str:
    """The rows of one size (one per implementation, in header order) as one line."""
    head = rows[0]
    line = f" {head.bytes:>11} {head.count:>12} {head.dtype:>8} {head.redop:>6}"
    for row in rows:
        line += f" | {row.time_us:>11.1f} {row.algbw:>7.2f} {row.busbw:>7.2f} {row.wrong:>7}"
    by_impl = {row.impl: row for row in rows}
    for native in _natives(list(by_impl)):
        line += f" | {by_impl[native].time_us / by_impl['ring'].time_us:>9.2f}"   # same bytes: busbw ratio
    for compressed in _compressed(list(by_impl)):
        line += f" | {by_impl['ring'].time_us / by_impl[compressed].time_us:>9.2f}"
    return line


def _natives(impls: list[str]) -> list[str]:
    """The library implementations ours is compared with (mpi, gloo, nccl), when ours is timed."""
    return [impl for impl in impls if impl != "ring" and impl not in COMPRESSED] if "ring" in impls else []


def _compressed(impls: list[str]) -> list[str]:
    """Our compressed all-reduces (``ring-bf16``...), compared with our plain one when it is timed:
    their busbw over its (above 1, compression pays)."""
    return [impl for impl in impls if impl in COMPRESSED] if "ring" in impls else []


def write_json(path: str, environment: dict, rows: list[Row]) -> None:
    """``{"environment": {...}, "rows": [{impl, op, dtype, ...}, ...]}``, replacing ``path`` whole."""
    text = json.dumps({"environment": environment, "rows": [asdict(r) for r in rows]}, indent=1)
    _replace(path, text + "\n")


def write_csv(path: str, environment: dict, rows: list[Row]) -> None:
    """One line per row; the columns are Row's fields, then the environment's plain values."""
    names = [f.name for f in fields(Row)]
    extra = {k: v for k, v in environment.items() if isinstance(v, (str, int, float)) and k not in names}
    names += list(extra)
    tmp = Path(f"{path}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({**asdict(row), **extra})
    os.replace(tmp, path)


def plot(path: str, environment: dict, rows: list[Row]) -> None:
    """busbw against size, one line per implementation, log axes, with the memory-copy ceiling
    (algbw on one rank, where busbw is 0 by definition)."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = rows[0]
    metric = "busbw" if bus_factor(head.op, head.n) > 0 else "algbw"   # one rank: no bus to speak of
    figure, axes = plt.subplots(figsize=(8, 5))
    for impl in dict.fromkeys(r.impl for r in rows):
        mine = [r for r in rows if r.impl == impl]
        axes.plot([r.bytes for r in mine], [getattr(r, metric) for r in mine], marker="o", markersize=3,
                  label=impl)
    copy = environment.get("memcpy_gbps")
    if copy:
        what = "device copy, one GPU" if environment.get("device") == "cuda" else "memcpy, one process"
        axes.axhline(copy, color="grey", linestyle="--", label=f"{what} ({copy:.1f} GB/s)")
    axes.set(yscale="log", xlabel="size (bytes)",
             ylabel="bus bandwidth (GB/s)" if metric == "busbw" else "algorithm bandwidth (GB/s)",
             title=f"{head.op}, {head.dtype} {head.redop}, {head.n} ranks ({environment.get('hosts', '')})")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: format_size(int(x))))
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    figure.savefig(tmp, dpi=120)
    plt.close(figure)
    os.replace(tmp, path)


def _replace(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a reader never sees half of it."""
    tmp = Path(f"{path}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
