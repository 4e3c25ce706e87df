"""Tier 2: DDP scripts on the "ring" backend run as users run them (``tests/programs/torch_ddp.py``
under mpiexec): no MASTER_ADDR, identical replicas, and failures that end the job fast."""
import re
import time

import pytest

from tests.worlds import run_world

pytest.importorskip("torch")
BOUND_S = 60


def scenario(n: int, name: str, timeout: float = 20):
    """Run it with the runtime's timeout ``timeout``; return (exit status, output, wall seconds)."""
    started = time.monotonic()
    result = run_world(n, ["-m", "tests.programs.torch_ddp", name], BOUND_S, env={"COLLECTIVES_TIMEOUT": str(timeout)})
    return result.returncode, result.stdout, time.monotonic() - started


@pytest.mark.parametrize("n", [1, 2, 3])
def test_init_process_group_ring_needs_nothing_more_and_replicas_end_identical(n):
    status, output, _ = scenario(n, "plain")
    digests = dict(re.findall(r"rank (\d+): params ([0-9a-f]{16})", output))   # (lines of two ranks may run together)
    assert status == 0 and sorted(digests) == [str(r) for r in range(n)], output
    assert len(set(digests.values())) == 1, output


def test_a_parameter_that_differs_on_one_rank_is_named_and_the_job_ends():
    status, output, wall = scenario(2, "differs")
    assert status not in (0, -9) and wall < BOUND_S, output
    assert re.search(r"rank 1: RuntimeError .*params\[0\] in this process with sizes \[33, 20\]", output), output


def test_a_rank_that_dies_mid_training_ends_every_rank_fast():
    """Fast: within the world's bound, where the runtime's timeout is far longer, so the job cannot
    have ended by a timeout."""
    status, output, wall = scenario(3, "dies", timeout=10 * BOUND_S)
    assert status not in (0, -9) and wall < BOUND_S, output
    assert "rank 0: step 2" in output and "rank 1: step 3" not in output, output
