"""A rank's record of its own tests, read by the run that launched its world (tests/world_outcomes.py).

Every rank of a world runs pytest on the same files (pytest-mpi's ``--with-mpi``). Loaded with
``-p tests.world_report --world-report DIR``, each rank appends to ``DIR/rank-R.jsonl``, one JSON
object a line, written and flushed as it happens, so that what a rank did before it died or was
killed survives it (JUnit XML is written only at the end of a run, so a crash would leave none):

    {"collected": [nodeid, ...]}                          the tests this rank is about to run, in order
    {"started": nodeid}                                   a test begins
    {"nodeid": ..., "outcome": ..., "message": ..., ...}  a test ended: passed, failed or skipped; a
                                                          module that could not be collected ends as a
                                                          failed "test" of its own
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

#: Where each MPI's launcher tells a process its rank (read from the environment, so that loading this
#: plugin does not start MPI before the code under test chooses how: collectives sets mpi4py.rc first).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def pytest_addoption(parser):
    parser.addoption("--world-report", metavar="DIR", default=None,
                     help="write this rank's test outcomes to DIR/rank-R.jsonl (tests/world_report.py)")


def pytest_configure(config):
    directory = config.getoption("--world-report")
    if directory:
        config.pluginmanager.register(RankRecord(Path(directory) / f"rank-{launcher_rank()}.jsonl"), "world-report")


def launcher_rank() -> int:
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    raise RuntimeError(f"--world-report: no rank in the environment ({', '.join(RANK_VARIABLES)}): run under mpiexec")


class RankRecord:
    """Writes one rank's lines (see the module docstring)."""

    def __init__(self, path: Path):
        self._file = path.open("a", buffering=1)   # (line-buffered: each line reaches the file as written)
        self._phases: dict[str, list[pytest.TestReport]] = {}

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def pytest_collection_finish(self, session):
        self._write({"collected": [item.nodeid for item in session.items]})

    def pytest_collectreport(self, report):
        if report.failed:
            self._write({"nodeid": report.nodeid, "outcome": "failed", "when": "collect",
                         "message": report.longreprtext, "crash": crash_line(report), "location": None})

    def pytest_runtest_logstart(self, nodeid):
        self._write({"started": nodeid})
        self._phases[nodeid] = []

    def pytest_runtest_logreport(self, report):
        self._phases.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        self._write({"nodeid": nodeid, "location": list(location), **ended(self._phases.pop(nodeid, []))})

    def pytest_unconfigure(self):
        self._file.close()


def ended(phases: list[pytest.TestReport]) -> dict:
    """How a test ended, from the reports of its phases (setup, call, teardown): the first phase that
    failed or skipped decides, as in pytest's own summary. An expected failure counts as a skip (its
    reason says so), an unexpected pass as a pass, a strict one as the failure pytest makes it."""
    duration = sum(report.duration for report in phases)
    for report in phases:
        if report.failed:
            return {"outcome": "failed", "when": report.when, "message": report.longreprtext,
                    "crash": crash_line(report), "duration": duration}
        if report.skipped:
            return {"outcome": "skipped", "when": report.when, "message": skip_reason(report), "crash": "",
                    "duration": duration}
    return {"outcome": "passed", "when": "call", "message": "", "crash": "", "duration": duration}


def skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason (pytest keeps it as (path, line, reason)), or an expected failure's."""
    if getattr(report, "wasxfail", None) is not None:
        return f"expected to fail: {report.wasxfail}"
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def crash_line(report) -> str:
    """The failure's one line (what pytest's short summary shows), or ""."""
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else ""
