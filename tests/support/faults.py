"""The test programs (tests/programs) run under mpiexec, each rank's end judged from what it
printed: the bounds they are held to, a scenario's run, the errors each rank reported, the lines a
rank wrote to a file of its own (``own_output.sh``) and a timeline's events."""
import json
import re
import time
from pathlib import Path

from tests.worlds import ROOT, run_world

BOUND_S = 60   # "well under a minute": no scenario may take longer to end
LEAVE_BOUND_S = 10.0   # a rank waiting for one that left knows within this (by message: about 0.1 s when idle)
AT_ONCE_S = 0.5   # a call that can know as it starts that it fails raises within this (milliseconds when idle)
DEADLINE_SLACK_S = 5.0   # how late past its deadline a timed-out call may raise on a loaded machine
OWN_OUTPUT = ROOT / "tests" / "programs" / "own_output.sh"


def fault(n: int, *scenario: str, bound: float = BOUND_S):
    """Run a scenario of tests/programs/faults.py; return (exit status, output, wall seconds)."""
    started = time.monotonic()
    result = run_world(n, ["-m", "tests.programs.faults", *scenario], bound)
    return result.returncode, result.stdout, time.monotonic() - started


def reported_errors(output: str, kind: str = "CollectiveError") -> dict[int, tuple[float, str]]:
    """rank -> (seconds the call took, message), from the lines ``report`` (tests/programs/cues.py) prints on every rank."""
    found = {}
    for rank, seconds, message in re.findall(rf"rank (\d+): {kind} after ([\d.]+) s in [^:]+: (.*)", output):
        found[int(rank)] = (float(seconds), message)
    return found


def trace_events(path: Path) -> list[dict]:
    """The events of a timeline file (COLLECTIVES_TIMELINE)."""
    return json.loads(path.read_text())["traceEvents"]


def read_own_output(tmp_path: Path, rank: int) -> str:
    """What rank ``rank`` wrote to its own file under ``tmp_path`` (``own_output.sh``; "" if none)."""
    path = tmp_path / f"out.{rank}"
    return path.read_text() if path.exists() else ""
