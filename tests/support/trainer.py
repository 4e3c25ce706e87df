"""The trainer run as users run it (``mpiexec ... python -m trainer``): a small run to its end, its
final parameters; a run started in its own session, read line by line and finished; an elastic
run that loses a rank, and the restart its end must equal."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.worlds import ROOT, keep_survivors, mpiexec, run_world
from trainer import checkpoint

TIMEOUT_S = 180
SMALL = ["--epochs", "3", "--dtype", "float64", "--batch-size", "50"]   # 50 does not divide by 3: uneven shards
CLEANUP = keep_survivors()


def train(n, tmp_path, name, *flags):
    """``mpiexec -n n python -m trainer SMALL --checkpoint-dir tmp_path/name FLAGS``, which must end
    well: its directory and output."""
    directory = tmp_path / name
    result = run_world(n, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), *flags], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    return directory, result.stdout


def final_params(directory):
    """The parameters and velocity of the newest valid checkpoint in ``directory``."""
    path, saved = checkpoint.newest_valid(directory)
    return saved["params"], saved["velocity"]


def start(n: int, flags: list[str]) -> subprocess.Popen:
    """``mpiexec -n n python -m trainer FLAGS`` in its own session (a Ctrl-C to mpiexec alone)."""
    return subprocess.Popen([*mpiexec(), "-n", str(n), sys.executable, "-m", "trainer", *flags], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_until(process: subprocess.Popen, text: str, seconds: float = 120) -> str:
    """The output up to the first line holding ``text`` (the run is killed if none comes in time)."""
    lines, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return "".join(lines)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"no line with {text!r} in time:\n" + "".join(lines) + process.communicate()[0])


def finish(process: subprocess.Popen, seconds: float = 60) -> str:
    """The rest of a started run's output, once it ends (killed after ``seconds``: "TIMED OUT" first)."""
    try:
        return process.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return "TIMED OUT\n" + process.communicate()[0]


def trainer_killing(train: list[str], when: str, victim: int, seconds: float = 120) -> tuple[str, int]:
    """``train`` under ``--elastic`` at n = 4; once a line starts with ``when``, SIGKILL the process of
    rank ``victim`` (by the pid the trainer prints). Returns the output and mpiexec's status (-9: the
    job did not end within ``seconds`` of that line, or 120 s in all, and was killed)."""
    command = [*mpiexec(), *CLEANUP, "-n", "4", sys.executable, *train, "--elastic", "--min-ranks", "2"]
    job = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    bound = threading.Timer(120, os.killpg, (job.pid, signal.SIGKILL))   # (a silent hang ends the loop too)
    bound.start()
    lines = []
    try:
        for line in job.stdout:
            lines.append(line)
            if line.startswith(when):
                pids = re.search(r"ranks \(pid\): (.*?)  \(", "".join(lines)).group(1)
                os.kill(int(re.search(rf"{victim} \((\d+)\)", pids).group(1)), signal.SIGKILL)
                bound.cancel()
                bound = threading.Timer(seconds, os.killpg, (job.pid, signal.SIGKILL))
                bound.start()
        job.wait()
    finally:
        bound.cancel()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return "".join(lines), job.returncode


def ends_as_a_restart(out: str, train: list[str], before: int, step: int, after: int, tmp_path) -> None:
    """The elastic run's final parameters (its output ``out``) are those of ``before`` ranks to
    ``step`` (--max-steps, a checkpoint), then ``after`` ranks resumed from it, bit for bit."""
    digest = re.search(r"parameters identical on every rank \(blake2b (\w+)\)", out).group(1)
    directory = str(tmp_path / "reference")
    first = run_world(before, [*train, "--max-steps", str(step), "--checkpoint-dir", directory], 120)
    assert first.returncode == 0, first.stdout[-3000:]
    second = run_world(after, [*train, "--checkpoint-dir", directory, "--resume"], 120)
    assert second.returncode == 0 and f"blake2b {digest}" in second.stdout, (out[-2000:], second.stdout[-2000:])
