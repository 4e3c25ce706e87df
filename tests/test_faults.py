"""Issue 6's fault suite: absent and killed ranks end the job fast with a clear message, and a
training run killed at a random moment resumes to the same parameters. Every world is bounded."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ring.transport.mpi import _process_state
from tests.test_trainer import final_params
from tests.worlds import ROOT, mpiexec, run_world

BOUND_S = 60   # "well under a minute": no scenario may take longer to end


def test_an_absent_rank_makes_the_others_time_out_naming_it():
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "absent"], BOUND_S)
    assert time.monotonic() - started < BOUND_S and result.returncode not in (0, -9), result.stdout
    for rank in (0, 1):
        assert f"rank {rank}: CollectiveError: allreduce #1 on rank {rank}: timed out after 2 s" in result.stdout
        assert "rank(s) that never arrived: 2\n" in result.stdout, result.stdout
        assert f"rank {rank}: then: allreduce: the runtime stopped after an earlier failure" in result.stdout


def test_a_rank_killed_mid_allreduce_ends_the_job_fast():
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "killed"], BOUND_S)
    assert time.monotonic() - started < 30, result.stdout
    assert result.returncode not in (0, -9) and "never noticed" not in result.stdout, result.stdout


def test_a_dead_process_is_told_apart_from_a_live_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert _process_state(child.pid) == "has exited"
    assert _process_state(os.getpid()) is None


SYNTHETIC = ["--dataset", "synthetic", "--samples", "6000", "--features", "256", "--hidden", "256", "256",
             "--dtype", "float64", "--batch-size", "60", "--epochs", "6"]


def test_training_killed_at_a_random_moment_resumes_to_the_same_parameters(tmp_path):
    straight = tmp_path / "straight"
    result = run_world(2, ["-m", "trainer", *SYNTHETIC, "--checkpoint-dir", str(straight)], 300)
    assert result.returncode == 0, result.stdout[-3000:]

    crashed = tmp_path / "crashed"
    command = [*mpiexec(), "-n", "2", sys.executable, "-m", "trainer", *SYNTHETIC, "--checkpoint-dir", str(crashed)]
    job = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(crashed.glob("checkpoint-*.npz")) and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 0.5))          # somewhere inside a later epoch, or in a save
        victim = random.choice(_trainer_pids(str(crashed)))
        os.kill(victim, signal.SIGKILL)
        output, _ = job.communicate(timeout=BOUND_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0, "the job should fail when one of its ranks is killed"
    assert f"({victim})" in output.split("ranks (pid): ")[1].splitlines()[0], "the dead pid maps to a rank"

    resumed = run_world(2, ["-m", "trainer", *SYNTHETIC, "--checkpoint-dir", str(crashed), "--resume"], 300)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stdout[-3000:]
    for a, b in zip(final_params(straight), final_params(crashed)):
        np.testing.assert_array_equal(a, b)


def _trainer_pids(marker: str) -> list[int]:
    """The pids of the python processes whose command line names ``marker`` (the ranks, not mpiexec)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if marker.encode() in argv and b"trainer" in argv and not any(b"mpiexec" in a for a in argv[:1]):
            pids.append(int(entry.name))
    assert pids, f"no trainer processes found for {marker}"
    return pids
