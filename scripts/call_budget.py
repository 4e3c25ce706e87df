"""What one small call of each collective costs the runtime, counted, not timed: the Python function
calls (cProfile) and, where valgrind is installed, the instructions, per call at n=1.

    python scripts/call_budget.py                 # the budget table, and what each guarantee costs
    python scripts/call_budget.py --no-valgrind   # counts only (valgrind takes about a minute)

At n=1 nothing waits, so the counts are exact and the same on every run (the median call's:
see calls_per_call); the frame is the one
that runs at any n (recursive doubling with no step: no shortcut for one rank). Budgets (issue
26): an 8-byte allreduce at most 25 calls, every other collective at most 40. The second table
shows what each guarantee or option adds to an 8-byte allreduce, in calls and microseconds (the
times are medians on this machine, for orientation only). Exit status 1 if a budget is exceeded.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import subprocess
import sys
import timeit

import numpy as np

import collectives as col

BUDGET = {"allreduce": 25}
DEFAULT_BUDGET = 40
_X, _OUT, _ROWS = np.ones(2, np.float32), np.empty(2, np.float32), np.ones((1, 2), np.float32)

#: Each collective's 8-byte call, as a program makes it (into ``out=`` where it takes one).
CALLS = {
    "allreduce": lambda: col.allreduce(_X, out=_OUT),
    "allreduce (new result)": lambda: col.allreduce(_X),
    "reduce_scatter": lambda: col.reduce_scatter(_X, out=_OUT),
    "allgather": lambda: col.allgather(_X, out=_OUT),
    "broadcast": lambda: col.broadcast(_OUT),
    "barrier": lambda: col.barrier(),
    "allreduce_many": lambda: col.allreduce_many([_OUT]),
}

#: What each guarantee or option adds to the 8-byte allreduce (set up, call, tear down).
PIECES = {
    "the call as a program makes it": (None, lambda: col.allreduce(_X, out=_OUT), None),
    "name= (compared across ranks)": (None, lambda: col.allreduce(_X, out=_OUT, name="step"), None),
    "timeout= (a deadline of its own)": (None, lambda: col.allreduce(_X, out=_OUT, timeout=30), None),
    "algorithm= forced": (None, lambda: col.allreduce(_X, out=_OUT, algorithm="doubling"), None),
    "async_op=True, then wait()": (None, lambda: col.allreduce(_X, out=_OUT, async_op=True).wait(), None),
    "on a group (group=)": (None, None, None),   # filled in by main: needs the group
    "an int32 array": (None, lambda: col.allreduce(_INTS, out=_INTS), None),
    "a 2-D array": (None, lambda: col.allreduce(_ROWS, out=_ROWS), None),
    "timeline recorded": (lambda: col.init(timeline=_TRACE), lambda: col.allreduce(_X, out=_OUT),
                          lambda: col.init(timeline="")),
}
_INTS = np.ones(2, np.int32)
_TRACE = "/tmp/call_budget_trace.json"


def calls_per_call(fn, repeats: int = 200) -> float:
    """cProfile's count of function calls (Python and C) in a call of ``fn``, the median of ``repeats``
    calls after a warm-up: the usual call's (a call that the machine paused for a while also looks for
    the others' words after its pause, a few calls more: a loaded machine makes some, and their mean
    moved the count by one)."""
    for _ in range(20):
        fn()
    counts = []
    for _ in range(repeats):
        profile = cProfile.Profile()
        profile.enable()
        fn()
        profile.disable()
        counts.append(pstats.Stats(profile).total_calls - 1)   # (less the profiler's own disable)
    return float(np.median(counts))


def microseconds(fn) -> float:
    """The median of 7 timings of 2000 calls, per call (for orientation: this machine is noisy)."""
    return float(np.median(timeit.repeat(fn, number=2000, repeat=7))) / 2000 * 1e6


def instructions_per_call(name: str) -> float | None:
    """Instructions per call of collective ``name`` (valgrind's count of 2000 calls, less that of
    20, over 1980), or None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    for n in (20, 2000):
        run = subprocess.run(["valgrind", "--tool=lackey", "--basic-counts=yes", sys.executable, __file__,
                              "--inner", name, str(n)], capture_output=True, text=True, timeout=900)
        found = [line for line in run.stderr.splitlines() if "guest instrs:" in line]
        if run.returncode != 0 or not found:
            return None
        counts.append(int(found[0].replace(",", "").split()[-1]))
    return (counts[1] - counts[0]) / 1980


def inner(name: str, n: int) -> None:
    """(Under valgrind) make ``n`` calls of collective ``name``."""
    col.init()
    fn = CALLS[name]
    for _ in range(n):
        fn()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-valgrind", action="store_true", help="skip the instruction counts")
    parser.add_argument("--inner", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner[0], int(args.inner[1]))
        return 0
    col.init()
    if col.size() != 1:
        print("call_budget.py: run it as one process (the counts are exact at n=1)", file=sys.stderr)
        return 2
    over = []
    print(f"# python scripts/call_budget.py; {col.size()} rank, numpy {np.__version__}, python "
          f"{sys.version.split()[0]}, on {os.uname().nodename} (load {os.getloadavg()[0]:.1f}: the times move with it)")
    print(f"# {'collective (8 bytes)':24} {'calls':>7} {'budget':>7} {'instructions':>13} {'us':>7}")
    for name, fn in CALLS.items():
        budget = BUDGET.get(name.split()[0], DEFAULT_BUDGET)
        calls = calls_per_call(fn)
        instructions = None if args.no_valgrind else instructions_per_call(name)
        shown = f"{instructions:13.0f}" if instructions is not None else f"{'-':>13}"
        print(f"  {name:24} {calls:7.0f} {budget:7d} {shown} {microseconds(fn):7.2f}"
              + ("   OVER BUDGET" if calls > budget else ""))
        if calls > budget:
            over.append(name)
    pieces(dict(PIECES))
    return 1 if over else 0


def pieces(table: dict) -> None:
    """The second table: what each guarantee or option adds to an 8-byte allreduce."""
    pair = col.new_group([0])
    table["on a group (group=)"] = (None, lambda: col.allreduce(_X, out=_OUT, group=pair), None)
    print("#")
    print(f"# {'8-byte allreduce, with':40} {'calls':>7} {'us':>7}")
    for what, (before, fn, after) in table.items():
        if before:
            before()
        try:
            print(f"  {what:40} {calls_per_call(fn):7.0f} {microseconds(fn):7.2f}")
        finally:
            if after:
                after()
    pair.destroy()


if __name__ == "__main__":
    sys.exit(main())
