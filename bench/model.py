"""``python -m bench --model``: fit the cost model (``ring.cost``) to this machine, show how well it
predicts every algorithm, and what it predicts for large worlds.

1. Sweep: for each world size k = 2 .. n (the first k ranks, as a group), every collective,
   every algorithm it has (forced, as COLLECTIVES_ALGORITHM does) and every size, time the
   call as the bench does (barrier, slowest rank, median) and check its result.
2. Fit: ``call``, ``alpha``, ``beta``, ``gamma`` by least squares on the relative error
   (each row divided by its measured time, so 8 B counts as much as 64 MiB), none negative.
3. Print measured against predicted, with the error in %, then the prediction for
   n = 2 .. 4096 (``--link`` prices the network between hosts, ``--hosts HxL`` puts the
   ranks on H hosts of L, with the two-level all-reduce among the candidates), and the
   sizes where the choice changes (the crossovers the runtime acts on).
"""
from __future__ import annotations

import argparse
import math
import os
import re

import numpy as np
from mpi4py import MPI

import collectives as col
from bench.cases import Case, bus_factor
from bench.report import GB
from bench.sizes import format_size, sweep
from bench.timing import time_each
from cmdline.cores import usable_cpus
from cmdline.interrupt import stop_together
from cmdline.parser import INTERRUPTED
from ring import cost

#: The world sizes and buffer sizes of the predictions.
SCALES = (2, 4, 8, 16, 64, 256, 1024, 4096)
PREDICTED_SIZES = tuple(4 ** k * 8 for k in range(13))   # 8 B .. 128 MiB


def parse_link(text: str) -> cost.Costs:
    """``25GB/s,5us`` -> the network's beta (s/B) and alpha (s); units GB/s, MB/s; s, ms, us, ns.

    >>> link = parse_link("25GB/s,5us"); f"{link.beta:g} s/B, {link.alpha:g} s"
    '4e-11 s/B, 5e-06 s'
    """
    match = re.fullmatch(r"\s*([\d.]+)\s*([GM])B/s\s*,\s*([\d.]+)\s*(s|ms|us|ns)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected BANDWIDTH,LATENCY like 25GB/s,5us, got {text!r}")
    rate = float(match[1]) * {"G": 1e9, "M": 1e6}[match[2]]
    latency = float(match[3]) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[match[4]]
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"the bandwidth must be positive, like 25GB/s,5us, got {text!r}")
    return cost.Costs(0.0, latency, 1 / rate, 0.0)


def parse_hosts(text: str) -> tuple[int, int]:
    """``512x8`` -> (512 hosts, 8 ranks on each).

    >>> parse_hosts("512x8")
    (512, 8)
    """
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise argparse.ArgumentTypeError(f"expected HOSTSxRANKS like 512x8, got {text!r}")
    return int(match[1]), int(match[2])


class _Forced(Case):
    """A case whose implementations are the algorithms: ``run("halving")`` forces it for that call
    (``algorithm=``), each in a pass of its own at each size, like the bench's implementations."""

    def run(self, algorithm: str):
        self.algorithm = algorithm
        return super().run("ring")

    def in_a_lane(self, algorithm: str) -> bool:
        """Whether the calls that forced ``algorithm`` ran in an express lane (docs/performance.md): a
        collective with lanes (``col.table.LANED``) has one for recursive doubling, and on two ranks
        for every algorithm, up to a segment of each rank's part (``tests/mpi/test_bench_cases.py``
        checks this against the lanes kept)."""
        return self.op in col.table.LANED and (algorithm == "doubling" or self.n == 2 and
                                               self.x.nbytes <= col.settings().segment())

    def candidates(self) -> list[str]:
        """The algorithms that can carry this call (an all-gather chooses for every rank's rows and
        counts: see ``collectives.ops.bodies.allgather``)."""
        nbytes = self.nbytes + 16 * self.n if self.op == "allgather" else self.nbytes
        return list(cost.candidates(self.op, nbytes, col.settings().small_bytes))


def measure(comm: MPI.Comm, args: argparse.Namespace) -> list[dict]:
    """Step 1 of the module: one row per (k, collective, algorithm, size) with the median seconds."""
    rows = []
    for k in range(2, comm.Get_size() + 1):
        inside = comm.Get_rank() < k
        sub = comm.Split(0 if inside else MPI.UNDEFINED, comm.Get_rank())
        group = col.new_group(range(k))
        if inside:
            for op in args.model_ops:
                for nbytes in sweep(args.min_bytes, args.max_bytes, args.factor):
                    case = _Forced(sub, op, args.dtype, args.redop, nbytes, 0, group=group)
                    if case.count == 0:
                        continue
                    iters = args.iters or max(5, min(200, (64 << 20) // case.nbytes))
                    chosen = col.algorithm_for(op, case.x, group=group)
                    for a in case.candidates():
                        t = time_each(sub, case, [a], iters, max(1, iters // 10))[a]
                        rows.append({"n": k, "op": op, "algorithm": a, "bytes": case.nbytes, "seconds": t.seconds,
                                     "wrong": t.wrong, "chosen": chosen, "lane": case.in_a_lane(a)})
            sub.Free()
        comm.Barrier()
    return rows


def fit(rows: list[dict], segment_bytes: int, check: bool, lanes: bool = False) -> cost.Costs:
    """Step 2: the non-negative costs that minimise the squared relative error over ``rows``; ``lanes``:
    calls an express lane carried, whose rounds cost their messages alone (``cost.Costs.round``)."""
    names = ["call", "alpha", "beta", "gamma"]
    counted = [cost.terms(r["op"], r["algorithm"], r["n"], r["bytes"], segment_bytes, check) for r in rows]
    design = np.array([[1.0 + (0 if lanes else t.rounds), t.messages, t.moved, t.reduced] for t in counted])
    measured = np.array([r["seconds"] for r in rows])
    free = list(range(4))
    while True:
        solution, *_ = np.linalg.lstsq(design[:, free] / measured[:, None], np.ones(len(rows)), rcond=None)
        if (solution >= 0).all() or len(free) == 1:
            break
        free.pop(int(np.argmin(solution)))   # a negative cost means that term explains nothing here
    values = dict.fromkeys(names, 0.0)
    for index, value in zip(free, solution):
        values[names[index]] = max(0.0, float(value))
    return cost.Costs(**values, round=0.0 if lanes else None)


def _costs_text(costs: cost.Costs) -> str:
    """The four costs, as the report prints them.

    >>> _costs_text(cost.Costs(call=3e-5, alpha=1e-5, beta=2e-10, gamma=0))
    'call 30.00 us, alpha 10.00 us per message, beta 0.200 ns/B (5.00 GB/s), gamma 0.000 ns/B (inf GB/s)'
    """
    return (f"call {costs.call * 1e6:.2f} us, alpha {costs.alpha * 1e6:.2f} us per message, beta "
            f"{costs.beta * 1e9:.3f} ns/B ({1 / costs.beta / GB if costs.beta else math.inf:.2f} GB/s), gamma "
            f"{costs.gamma * 1e9:.3f} ns/B ({1 / costs.gamma / GB if costs.gamma else math.inf:.2f} GB/s)")


def report(rows: list[dict], costs: cost.Costs, args: argparse.Namespace, segment_bytes: int, check: bool,
           lanes: cost.Costs | None = None, cpus: int | None = None) -> None:
    """Step 3: the printed tables (rank 0). ``costs``: fitted on the calls that took the usual way;
    ``lanes``: on those an express lane carried (None: there were none); ``cpus``: the cpus this host's
    ranks may run on together (``cmdline.cores.usable_cpus``; None: this rank's own)."""
    usual = sum(not r["lane"] for r in rows)
    print(f"# fitted on this machine, the usual way ({usual} timings): {_costs_text(costs)}")
    if lanes is not None:
        print(f"# fitted on this machine, in express lanes ({len(rows) - usual} timings): {_costs_text(lanes)}")
    print(f"# in ring/cost.py the runtime chooses with MEASURED: {_costs_text(cost.MEASURED)}")
    print(f"#   and, where every algorithm has a lane, LANES: {_costs_text(cost.LANES)}")
    print("#")
    print(f"# {'n':>3} {'collective':>14} {'algorithm':>9} {'size':>6} | {'measured':>10} {'predicted':>10} "
          f"{'error':>7} | the runtime's choice (ring/cost.py), and whether it was the fastest here")
    errors: dict[int, list[float]] = {}
    for r in rows:
        predicted = cost.predict(r["op"], r["algorithm"], r["n"], r["bytes"], lanes if r["lane"] else costs,
                                 segment_bytes=segment_bytes, check=check)
        error = (predicted - r["seconds"]) / r["seconds"] * 100
        errors.setdefault(r["n"], []).append(abs(error))
        chosen = r["chosen"]
        best = min((s for s in rows if (s["n"], s["op"], s["bytes"]) == (r["n"], r["op"], r["bytes"])),
                   key=lambda s: s["seconds"])["algorithm"]
        mark = "" if r["algorithm"] != chosen else ("chosen, fastest" if chosen == best else "chosen")
        print(f"  {r['n']:>3} {r['op']:>14} {r['algorithm']:>9} {format_size(r['bytes']):>6} | "
              f"{r['seconds'] * 1e6:>8.1f}us {predicted * 1e6:>8.1f}us {error:>+6.0f}% | {mark}")
    for n, e in sorted(errors.items()):
        print(f"# n={n}: median |error| {np.median(e):.0f}%, 90th percentile {np.percentile(e, 90):.0f}%")
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    for line in fit_warnings(errors, costs, col.local_size(), cpus):
        print(f"# warning: {line}")
    wrong = sum(r["wrong"] for r in rows)
    print(f"# #wrong: {wrong} " + ("(every result exact)" if not wrong else "-- RESULTS ARE WRONG"))
    _predictions(costs, args, segment_bytes, check)


BAD_FIT_PERCENT = 25   # a median error above this: the four costs do not explain the timings


def fit_warnings(errors: dict[int, list[float]], costs: cost.Costs, ranks_here: int, cpus: int) -> list[str]:
    """What makes the fit untrustworthy, in words: a median error over BAD_FIT_PERCENT at some n,
    a cost fitted as 0 (its term was dropped: it explained nothing here), oversubscribed cores.

    >>> fit_warnings({2: [5, 8, 12]}, cost.Costs(call=3e-5, alpha=1e-5, beta=2e-10, gamma=2e-10), 2, 2)
    []
    >>> for line in fit_warnings({2: [10], 4: [70, 80]}, cost.Costs(call=0, alpha=1e-5, beta=2e-10, gamma=0), 4, 2):
    ...     print(line)
    the fit explains these timings badly (median |error| 75% at n=4, above 25%): do not choose by its predictions
    call and gamma fitted as 0: those terms explained nothing in these timings (dropped), so predictions leave them out
    4 ranks share 2 cpus here: waiting ranks take cores from working ones, and times measure that more than the algorithms
    """
    lines = []
    bad = [f"{np.median(e):.0f}% at n={n}" for n, e in sorted(errors.items()) if np.median(e) > BAD_FIT_PERCENT]
    if bad:
        lines.append(f"the fit explains these timings badly (median |error| {', '.join(bad)}, above "
                     f"{BAD_FIT_PERCENT}%): do not choose by its predictions")
    dropped = [name for name in ("call", "alpha", "beta", "gamma") if getattr(costs, name) == 0]
    if dropped:
        lines.append(f"{' and '.join(dropped)} fitted as 0: {'those terms' if len(dropped) > 1 else 'that term'} "
                     "explained nothing in these timings (dropped), so predictions leave "
                     f"{'them' if len(dropped) > 1 else 'it'} out")
    if ranks_here > cpus:
        lines.append(f"{ranks_here} ranks share {cpus} cpus here: waiting ranks take cores from working ones, and "
                     "times measure that more than the algorithms")
    return lines


def _predictions(costs: cost.Costs, args: argparse.Namespace, segment_bytes: int, check: bool) -> None:
    network = args.link or costs
    hosts = args.hosts
    where = (f"{hosts[0]} hosts x {hosts[1]} ranks" if hosts else "one host")
    link = (f"network {1 / network.beta / GB:.1f} GB/s, {network.alpha * 1e6:g} us" if args.link
            else "this machine's costs")
    op = "allreduce"
    print("#")
    print(f"# predicted {op} ({where}; {link}; per call {costs.call * 1e6:.1f} us, gamma {costs.gamma * 1e9:.3f} ns/B)")
    scales = [hosts[0] * hosts[1]] if hosts else list(SCALES)
    algorithms = list(cost.ALGORITHMS[op]) + (["two-level"] if hosts else [])
    print(f"# {'n':>5} {'size':>6} | " + " | ".join(f"{a:>9} time  busbw" for a in algorithms) + " | best")
    def predicted(n: int, nbytes: int) -> dict[str, float]:
        """Seconds of every algorithm that can carry ``nbytes`` on ``n`` ranks (with --link alone,
        every rank on a host of its own)."""
        layout = hosts if hosts else ((n, 1) if args.link else None)
        return {a: cost.predict(op, a, n, nbytes, costs, segment_bytes=segment_bytes, check=check,
                                hosts=layout, network=network)
                for a in cost.candidates(op, nbytes) + (("two-level",) if hosts else ())}

    for n in scales:
        for nbytes in PREDICTED_SIZES:
            times = predicted(n, nbytes)
            cells = [f"{_seconds(times[a]):>15} {nbytes / times[a] * bus_factor(op, n) / GB:>6.2f}" if a in times
                     else f"{'-':>15} {'-':>6}" for a in algorithms]
            print(f"  {n:>5} {format_size(nbytes):>6} | " + " | ".join(cells) + f" | {min(times, key=times.get)}")
    print("#")
    print("# crossovers (the best algorithm by size):")
    for n in scales:
        spans = []
        for nbytes in sweep(8, 1 << 30, 2):
            times = predicted(n, nbytes)
            best = min(times, key=times.get)
            if not spans or spans[-1][0] != best:
                spans.append([best, nbytes, nbytes])
            spans[-1][2] = nbytes
        print(f"  n={n:<5} " + ", ".join(f"{a} {format_size(lo)}-{format_size(hi)}" for a, lo, hi in spans))


def _seconds(t: float) -> str:
    return f"{t * 1e6:.1f}us" if t < 1e-3 else f"{t * 1e3:.2f}ms" if t < 1 else f"{t:.2f}s"


def run(args: argparse.Namespace, comm: MPI.Comm) -> int:
    col.init()
    settings = col.settings()
    segment_bytes = settings.segment()
    try:
        with stop_together():   # every rank stops at the same call (see bench.timing)
            rows = measure(comm, args)
    except KeyboardInterrupt:
        if comm.Get_rank() == 0:
            print("# interrupted (Ctrl-C or SIGTERM): nothing fitted", flush=True)
        return INTERRUPTED
    cpus = usable_cpus(comm)   # (every rank: a rank bound to a core of its own counts the others' too)
    if comm.Get_rank() == 0:
        in_lanes, plain = [r for r in rows if r["lane"]], [r for r in rows if not r["lane"]]
        lanes = fit(in_lanes, segment_bytes, settings.check, lanes=True) if in_lanes else None
        costs = fit(plain, segment_bytes, settings.check) if plain else lanes
        print(f"# {' '.join(['python -m bench', *args.argv])}")
        if not plain:   # (two ranks, and only collectives whose every algorithm has an express lane there)
            print("# every call measured ran in an express lane: the predictions for more ranks use the lanes' costs")
        print(f"# the first k ranks of {comm.Get_size()} for k = 2..{comm.Get_size()}; {args.dtype} {args.redop}; "
              f"{', '.join(args.model_ops)}; {format_size(args.min_bytes)}..{format_size(args.max_bytes)}")
        report(rows, costs, args, segment_bytes, settings.check, lanes, cpus)
    return 1 if any(r["wrong"] for r in rows) else 0
