"""Tier 2 launcher: runs tests/mpi in real MPI worlds of 1 to 5 ranks, each bounded in time."""
import pytest

from tests.worlds import run_world

WORLD_TIMEOUT_S = 480   # (5 ranks on 2 cores beside a CPU hog: the torch tests train DDP twice)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_collectives_in_a_real_world(n):
    result = run_world(n, ["-m", "pytest", "tests/mpi", "--with-mpi", "-q", "-x", "-p", "no:cacheprovider",
                           "--timeout", "240"], timeout=WORLD_TIMEOUT_S)
    assert result.returncode == 0, f"world of {n} failed (exit {result.returncode}):\n{result.stdout[-6000:]}"
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]
