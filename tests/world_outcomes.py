"""One outcome per test from a real MPI world: run pytest on every rank, merge what the ranks recorded,
and report each test of the world as a test of the run that launched it.

Every rank runs the same tests (pytest-mpi's ``--with-mpi``) and records how each ended
(tests/world_report.py). A test passed if it passed on every rank; it failed if it failed on any
rank (the ranks are named, each distinct message shown once), or if some rank never reported it:
that rank died, or the world was killed at its time bound, and the test says which and how the
world ended. A world that did not end as pytest ends (exit status 0, or 1 with failed tests)
fails the test that launched it, with the tail of its output.

The launching test's id stands in front of each inner test's own, so a world of 3 reports, e.g.::

    tests/test_worlds.py::test_collectives_in_a_real_world[3]::tests/mpi/test_api.py::test_block_bounds...
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.worlds import WORLD_PYTEST, run_world

WORLD_TIMEOUT_S = 480   # (5 ranks on 2 cores beside a CPU hog: the torch tests train DDP twice)
TEST_TIMEOUT_S = 240    # each test inside a world (pytest-timeout, on every rank)
TAIL_CHARS = 6000


@dataclass(frozen=True)
class Outcome:
    """How one test of a world ended, all its ranks taken together."""
    nodeid: str                   # the test's own id inside the world (tests/mpi/test_api.py::test_x)
    outcome: str                  # "passed", "failed" or "skipped"
    message: str = ""             # a failure's text (per rank), or a skip's reason
    crash: str = ""               # a failure in one line, for pytest's short summary
    location: tuple | None = None
    duration: float = 0.0         # the slowest rank's
    unreported: tuple = ()        # the ranks that never said how it ended (they died, or time ran out)


@dataclass
class RankLog:
    """What one rank recorded (tests/world_report.py): nothing at all if it died before collecting."""
    collected: list[str] | None = None
    started: set[str] = field(default_factory=set)
    ended: dict[str, dict] = field(default_factory=dict)


@dataclass
class World:
    n: int
    status: int
    output: str
    outcomes: list[Outcome]
    ending: str                   # how the world ended, in words

    @property
    def problem(self) -> str | None:
        """Why the world itself failed (it did not end as a pytest run ends), or None."""
        unreported = [o for o in self.outcomes if o.unreported]
        if unreported:
            why = f"{len(unreported)} test(s) not reported by every rank"
        elif self.status not in (0, 1) or not self.outcomes:
            why = "not the end of a pytest run (0: every test passed; 1: some failed)"
        elif self.status == 1 and not any(o.outcome == "failed" for o in self.outcomes):
            why = "pytest failed, but every test passed (a failure outside the tests: see the output)"
        else:
            return None
        return f"world of {self.n}: {self.ending}: {why}\n{self.output[-TAIL_CHARS:]}"


def run_tests_in_world(n: int, paths: list[str], directory: Path, timeout: float = WORLD_TIMEOUT_S,
                       env: dict | None = None) -> World:
    """``mpiexec -n n python -m pytest PATHS --with-mpi`` with each rank's record in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    result = run_world(n, [*WORLD_PYTEST, *paths, "--timeout",
                           str(TEST_TIMEOUT_S), "--continue-on-collection-errors",
                           "-p", "tests.world_report", "--world-report", str(directory)], timeout, env)
    if result.returncode == -9 and result.stdout.startswith("TIMED OUT"):
        ending = f"the world was killed at its time bound ({timeout:g} s)"
    else:
        ending = f"the world ended with exit status {result.returncode}"
    logs = {rank: read_rank(directory / f"rank-{rank}.jsonl") for rank in range(n)}
    return World(n, result.returncode, result.stdout, merge(logs, ending, result.stdout[-TAIL_CHARS:]), ending)


def read_rank(path: Path) -> RankLog:
    log = RankLog()
    if not path.exists():
        return log
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:   # (the last line of a rank killed while writing it)
            continue
        if "collected" in record:
            log.collected = record["collected"]
        elif "started" in record:
            log.started.add(record["started"])
        else:
            log.ended[record["nodeid"]] = record
    return log


def merge(logs: dict[int, RankLog], ending: str, tail: str) -> list[Outcome]:
    """One outcome per test that any rank collected or reported, in the order the ranks ran them."""
    order: dict[str, None] = {}
    for log in logs.values():
        order.update(dict.fromkeys([*(log.collected or []), *log.ended]))
    return [one_test(nodeid, logs, ending, tail) for nodeid in order]


def one_test(nodeid: str, logs: dict[int, RankLog], ending: str, tail: str) -> Outcome:
    records = {rank: log.ended.get(nodeid) for rank, log in logs.items()}
    reported = {rank: r for rank, r in records.items() if r is not None}
    location = next((tuple(r["location"]) for r in reported.values() if r.get("location")), None)
    duration = max((r.get("duration", 0.0) for r in reported.values()), default=0.0)
    failed = {rank: r for rank, r in reported.items() if r["outcome"] == "failed"}
    missing = {rank: why_unreported(logs[rank], nodeid) for rank in records if rank not in reported}
    if failed or missing:
        parts, lines = [], []
        for message, ranks in by_message({rank: r["message"] for rank, r in failed.items()}).items():
            parts.append(f"failed on {ranks_text(ranks)}:\n{message}")
            crash = failed[ranks[0]]["crash"] or (message.strip().splitlines() or ["(no message)"])[-1]
            lines.append(f"{ranks_text(ranks)}: {crash}")
        for why, ranks in by_message(missing).items():
            lines.append(f"{ranks_text(ranks)} {why}: {ending}")
            parts.append(lines[-1])
        if any(nodeid in logs[rank].started for rank in missing):   # (the test that was running when it ended)
            parts.append(f"the tail of the world's output:\n{tail}")
        return Outcome(nodeid, "failed", "\n\n".join(parts), "; ".join(lines), location, duration, tuple(missing))
    kinds = by_message({rank: r["outcome"] for rank, r in reported.items()})
    if len(kinds) > 1:   # a rank that skips a collective the others run leaves them waiting for it
        said = "; ".join(f"{kind} on {ranks_text(ranks)}" for kind, ranks in kinds.items())
        return Outcome(nodeid, "failed", f"the ranks did not run this test alike: {said}", said, location, duration)
    first = reported[min(reported)]
    return Outcome(nodeid, first["outcome"], first["message"], first["crash"], location, duration)


def why_unreported(log: RankLog, nodeid: str) -> str:
    """Why a rank has no outcome for a test, in words that follow "rank R"."""
    if log.collected is None:
        return "reported nothing (it ended before it had collected its tests)"
    if nodeid in log.started:
        return "started this test and never finished it"
    if nodeid in log.collected:
        return "never reached this test"
    return "never collected this test (its tests differ from the other ranks')"


def by_message(per_rank: dict[int, str]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for rank in sorted(per_rank):
        grouped.setdefault(per_rank[rank], []).append(rank)
    return grouped


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


class WorldFailure:
    """A failure's text for pytest's reports: the whole of it in the FAILURES section, its one line
    (``reprcrash.message``) in the short summary and in JUnit's message attribute."""

    def __init__(self, text: str, line: str):
        self.text = text
        self.reprcrash = type("Crash", (), {"message": line})()

    def toterminal(self, tw) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


#: The user property in which a test that ran worlds carries their outcomes (``Outcome`` as a dict) to
#: the session that reports them: under pytest-xdist a worker's reports cross to the controller as data.
WORLD_OUTCOMES = "world outcomes"


class WorldReports:
    """A plugin for the session that shows the reports: after a test that ran worlds, each test of
    those worlds is reported as a test of its own. (Under pytest-xdist that is the controller: a
    worker may report only the test it runs.)"""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.pending: dict[str, tuple[pytest.TestReport, list[Outcome]]] = {}

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(tryfirst=True)   # (before JUnit's XML, which would write the property out)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        worlds = [value for name, value in report.user_properties if name == WORLD_OUTCOMES]
        if not worlds:
            return
        report.user_properties = [(name, value) for name, value in report.user_properties if name != WORLD_OUTCOMES]
        if report.when == "teardown":   # (the call's report carries it too: the last, the teardown's, is read)
            outcomes = [Outcome(**o) for world in worlds for o in world]
            self.pending[report.nodeid] = (report, outcomes)
            # (they join the count that pytest's progress, "[ 42%]", is a share of)
            self.session.testscollected += len(outcomes)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        launcher, outcomes = self.pending.pop(nodeid, (None, []))
        for outcome in outcomes:
            report_one_test(self.config.hook, launcher, outcome)


def report_one_test(hook, launcher: pytest.TestReport, outcome: Outcome) -> None:
    """Report ``outcome`` as a test of its own after ``launcher``, the test that ran its world."""
    nodeid = f"{launcher.nodeid}::{outcome.nodeid}"
    path, line = outcome.location[:2] if outcome.location else (launcher.location[0], None)
    # (the FAILURES section's heading; not the id's tail, which pytest's verbose line would rewrite)
    location = (path, line, f"{outcome.nodeid} (in {launcher.location[2]})")
    hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    for report in phase_reports(nodeid, location, dict(launcher.keywords), outcome):
        hook.pytest_runtest_logreport(report=report)
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


def phase_reports(nodeid: str, location: tuple, keywords: dict, outcome: Outcome) -> list[pytest.TestReport]:
    """Setup, call and teardown, as pytest reports a test it ran itself (a skip ends at setup)."""
    def report(when, result, longrepr=None, duration=0.0):
        return pytest.TestReport(nodeid, location, keywords, result, longrepr, when, duration=duration)
    if outcome.outcome == "skipped":
        line = location[1] + 1 if location[1] is not None else 0   # (pytest shows skips' lines from 1)
        return [report("setup", "skipped", (location[0], line, outcome.message)),
                report("teardown", "passed")]
    failure = WorldFailure(outcome.message, outcome.crash) if outcome.outcome == "failed" else None
    return [report("setup", "passed"), report("call", outcome.outcome, failure, outcome.duration),
            report("teardown", "passed")]
