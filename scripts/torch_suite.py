"""PyTorch's own distributed tests (``DistributedTest._DistTestBase``) on the "ring" backend or on gloo,
each test in a fresh MPI world under a wall-clock bound; one line per test and a summary::

    python scripts/torch_suite.py -n 2 --backend ring
    python scripts/torch_suite.py -n 2 --backend gloo --tests test_all_reduce_sum,test_barrier --json gloo.json
    python scripts/torch_suite.py -n 2 --backend both        # gloo then ring, test by test: the comparison
    python scripts/torch_suite.py -n 3 --backend both        # odd world size (not run in CI)

The suite's gating is evaluated as for gloo on both backends (see tests/torch_suite.py). A test
that its gating skips is reported SKIP without a launch, as unittest does; every other test runs in
its own world of fresh processes (see tests/torch_suite.py) and is killed, with its whole world,
after ``--timeout`` seconds (a test to which torch gives a longer process-group timeout: that plus
30 s). ``both`` runs ring on every test that gloo does not skip (``--only-gloo-passes``: on those
gloo passes) and ends with the tests that pass on gloo and not on ring. Exit status: 1 if any test
failed (on ``both``: if any test that passes on gloo fails on ring), else 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.torch_suite import DEFAULT_BOUND_S, Outcome, Zygote, catalogue, run_test  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2, help="ranks per world (default 2)")
    parser.add_argument("--backend", choices=("ring", "gloo", "both"), default="ring")
    parser.add_argument("--tests", default="", help="comma-separated test names (default: every test)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_BOUND_S, help="seconds each test may take "
                        f"(default {DEFAULT_BOUND_S:.0f})")
    parser.add_argument("--only-gloo-passes", action="store_true", help="with --backend both: run ring only "
                        "where gloo passed")
    parser.add_argument("--fresh-interpreters", action="store_true", help="start every rank as a new Python "
                        "(as torch's spawn does; slower) rather than forked from a zygote that imported torch once")
    parser.add_argument("--json", type=Path, help="write every outcome (with a failure's output) to this file")
    parser.add_argument("--tail", type=int, default=0, help="print the last N lines of a failing world's output")
    args = parser.parse_args(argv)

    began = time.monotonic()
    zygote = None if args.fresh_interpreters else Zygote(args.n)
    try:
        return run(args, parser, zygote, began)
    finally:
        if zygote is not None:
            zygote.close()


def run(args, parser, zygote, began) -> int:
    listing = zygote.catalogue if zygote else catalogue(args.n)
    tests = listing["tests"]
    if args.tests:
        wanted = [t.strip() for t in args.tests.split(",") if t.strip()]
        known = {t["name"]: t for t in tests}
        unknown = [t for t in wanted if t not in known]
        if unknown:
            parser.error(f"not tests of DistributedTest._DistTestBase: {', '.join(unknown)}")
        tests = [known[t] for t in wanted]
    backends = ("gloo", "ring") if args.backend == "both" else (args.backend,)
    outcomes: list[Outcome] = []
    seconds = {b: 0.0 for b in backends}
    for test in tests:
        gloo = None
        for backend in backends:
            if backend == "ring" and gloo is not None and gloo.status != "PASS" and (
                    args.only_gloo_passes or gloo.status == "SKIP"):
                continue
            started = time.monotonic()
            outcome = run_test(args.n, backend, test, listing["skips"], args.timeout, zygote)
            seconds[backend] += time.monotonic() - started
            outcomes.append(outcome)
            gloo = outcome if backend == "gloo" else gloo
            print(outcome.line(), flush=True)
            if outcome.status == "FAIL" and args.tail:
                print("    " + outcome.tail(args.tail).replace("\n", "\n    "), flush=True)

    for backend in backends:
        mine = [o for o in outcomes if o.backend == backend]
        counts = {s: sum(o.status == s for o in mine) for s in ("PASS", "FAIL", "SKIP")}
        print(f"{backend} at n={args.n}: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
              f" of {len(mine)} in {seconds[backend]:.0f} s")
    regressions = []
    if args.backend == "both":
        ring = {o.test: o for o in outcomes if o.backend == "ring"}
        regressions = [ring[o.test] for o in outcomes
                       if o.backend == "gloo" and o.status == "PASS" and ring[o.test].status != "PASS"]
        print(f"pass on gloo, not on ring: {len(regressions)}"
              + "".join(f"\n    {o.test}: {o.status} {o.reason}" for o in regressions))
    print(f"total {time.monotonic() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "gated_as": listing["gated_as"], "seconds": seconds,
                                         "outcomes": [o.__dict__ for o in outcomes]}, indent=1))
    failed = regressions if args.backend == "both" else [o for o in outcomes if o.status == "FAIL"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
