"""Tier 2: the trainer's rank killed at a random moment (after the first checkpoint, inside a later epoch or
a save), then resumed: it must end with the parameters of a run that was never killed.

The moment and the victim come from a seeded generator, so that a failure can be replayed: the seed
is in the test's id (``[seed=37]``) and FAULT_SEED=<seed> runs it with another. The victim is chosen
as a rank, and found by the rank its launcher gave it, so a replay kills the same rank.
"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.trainer import final_params
from tests.worlds import ROOT, mpiexec, run_world


FAULT_SEED = int(os.environ.get("FAULT_SEED", "37"))
BOUND_S = 60   # the killed job must end within this
SYNTHETIC = ["--dataset", "synthetic", "--samples", "6000", "--features", "256", "--hidden", "256", "256",
             "--dtype", "float64", "--batch-size", "60", "--epochs", "6"]
RANK_VARIABLES = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=")   # where MPICH's and Open MPI's launchers put it


@pytest.mark.parametrize("seed", [FAULT_SEED], ids=lambda seed: f"seed={seed}")
def test_training_killed_at_a_random_moment_resumes_to_the_same_parameters(tmp_path, seed):
    chance = random.Random(seed)
    delay, victim_rank = chance.uniform(0.0, 0.5), chance.randrange(2)
    replay = f"seed {seed} (FAULT_SEED={seed} replays it): rank {victim_rank} killed {delay:.3f} s after " \
             "the first checkpoint"
    print(replay)
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
        time.sleep(delay)          # somewhere inside a later epoch, or in a save
        victim = _trainer_ranks(str(crashed))[victim_rank]
        os.kill(victim, signal.SIGKILL)
        output, _ = job.communicate(timeout=BOUND_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0, f"{replay}: the job should fail when one of its ranks is killed"
    assert f"{victim_rank} ({victim})" in output.split("ranks (pid): ")[1].splitlines()[0], \
        f"{replay}: the dead pid maps to its rank"

    resumed = run_world(2, ["-m", "trainer", *SYNTHETIC, "--checkpoint-dir", str(crashed), "--resume"], 300)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, (replay, resumed.stdout[-3000:])
    for a, b in zip(final_params(straight), final_params(crashed)):
        np.testing.assert_array_equal(a, b, err_msg=replay)


def _trainer_ranks(marker: str) -> dict[int, int]:
    """{rank: pid} of the python processes whose command line names ``marker`` (the ranks, not mpiexec)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if marker.encode() not in argv or b"trainer" not in argv or any(b"mpiexec" in a for a in argv[:1]):
                continue
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        rank = next((v.split(b"=", 1)[1] for v in environment if v.startswith(RANK_VARIABLES)), None)
        if rank is not None:
            ranks[int(rank)] = int(entry.name)
    assert sorted(ranks) == [0, 1], f"trainer ranks found for {marker}: {ranks}"
    return ranks
