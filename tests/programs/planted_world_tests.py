"""Tests with planted outcomes, run inside a world by tests/programs/planted_worlds.py (itself run by
tests/test_world_outcomes.py), to show that each world's tests are reported one by one: a pass, a
skip, a failure on one rank only, and (as PLANTED_FAULT says) a rank that dies or hangs inside a test."""
import os
import time

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi

RANK = MPI.COMM_WORLD.Get_rank()
FAULT = os.environ.get("PLANTED_FAULT")


def test_passes_on_every_rank():
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()


def test_fails_on_rank_1_only():
    assert RANK != 1, "planted failure on rank 1"


@pytest.mark.skip(reason="planted skip")
def test_skipped_on_every_rank():
    raise AssertionError("a skipped test ran")


@pytest.mark.skipif(FAULT != "death", reason="only in the world where a rank dies")
def test_rank_1_dies_here():
    MPI.COMM_WORLD.Barrier()
    if RANK == 1:
        os._exit(9)   # (no Python cleanup, no word to the others: as a crash or the OOM killer would)
    MPI.COMM_WORLD.Barrier()   # the others wait here for a rank that is gone, until the launcher ends them


@pytest.mark.skipif(FAULT != "hang", reason="only in the world where a rank hangs")
def test_rank_1_hangs_here():
    if RANK == 1:
        time.sleep(3600)   # (the world's time bound ends it)
    MPI.COMM_WORLD.Barrier()


def test_runs_last():
    assert True
