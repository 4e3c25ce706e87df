"""Tier 2, issue 26: what the programs live on. ``settings()``, a per-call ``algorithm=`` (covered by
the cross-rank check), which algorithm a call ran (``Work.algorithm``, ``algorithm_for``),
``block_bounds``, ``to_host``/``synchronize``, and groups that run the collectives themselves.
Run under mpiexec -n 1..4 by tests/test_worlds.py."""
import dataclasses

import numpy as np
import pytest

import collectives as col
from ring import cost
from tests.support.in_world import COMM, N, RANK, agree, mpi_reference, rank_input


pytestmark = pytest.mark.mpi


def test_settings_are_what_was_agreed_and_read_only():
    s = col.settings()
    every = COMM.allgather((s.segment_bytes, s.small_bytes, s.check, s.algorithm, s.hosts))
    agree(len(set(every)) == 1, f"settings differ across ranks: {every}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.check = False
    col.init(small_bytes=4096)
    try:
        agree(col.settings().small_bytes == 4096, "init did not change the settings")
        agree(col.algorithm_for("allreduce", np.zeros(8192, np.uint8)) != "doubling", "8 KiB went by doubling "
                                                                                       "with small_bytes=4K")
    finally:
        col.init(small_bytes=s.small_bytes)
    agree(col.settings() == s, "the settings were not restored")


@pytest.mark.parametrize("algorithm", ["doubling", "halving", "ring"])
@pytest.mark.parametrize("count", [0, 1, N + 1, 1001])
def test_a_forced_algorithm_runs_and_is_exact(algorithm, count):
    x = rank_input(count, "int64", "sum")
    work = col.allreduce(x, algorithm=algorithm, async_op=True)
    result = work.wait()
    agree(np.array_equal(result, mpi_reference(x, "sum")), f"{algorithm} x{count}: differs from MPI")
    agree(work.algorithm == algorithm, f"forced {algorithm}, ran {work.algorithm}")


def test_the_runtime_reports_the_algorithm_it_chose():
    for count in (2, 1 << 18):
        x = np.ones(count, np.float32)
        work = col.allreduce(x, async_op=True)
        work.wait()
        predicted = col.algorithm_for("allreduce", x)
        agree(work.algorithm == predicted, f"x{count}: ran {work.algorithm}, algorithm_for said {predicted}")
        agree(predicted in cost.ALGORITHMS["allreduce"] + ("hierarchical",), f"unknown algorithm {predicted}")
    small = col.broadcast(np.ones(4), async_op=True)
    small.wait()
    agree(small.algorithm == col.algorithm_for("broadcast", np.ones(4)), f"broadcast ran {small.algorithm}")


@pytest.mark.skipif(N == 1, reason="one rank cannot disagree with itself")
def test_ranks_that_force_different_algorithms_raise_on_every_rank():
    x = np.ones(64, np.float32)
    with pytest.raises(col.CollectiveUsageError, match="algorithm: algorithm differs across ranks"):
        col.allreduce(x, algorithm="ring" if RANK == 0 else "halving")
    agree(np.array_equal(col.allreduce(x), np.full(64, N, np.float32)), "the next call was out of step")


@pytest.mark.parametrize("call, message", [
    (lambda: col.allreduce(np.ones(4), algorithm="fastest"), "allreduce: algorithm: expected None"),
    (lambda: col.reduce_scatter(np.ones(4), algorithm="halving"), "reduce_scatter: algorithm: expected None"),
    (lambda: col.allreduce(np.ones(1 << 16), algorithm="doubling"),
     r"allreduce: algorithm: 'doubling' cannot run this call: 'doubling' carries at most small_bytes \(\d+\) "
     r"bytes, this call 524288$"),
    (lambda: col.allgather(np.ones(1 << 15), algorithm="doubling"),   # (its message: every rank's, and counts)
     r"allgather: algorithm: 'doubling' cannot run this call: 'doubling' carries at most small_bytes \(\d+\) "
     r"bytes, this call \d+ \(the ranks' rows, and 16 bytes of counts from each\)$"),
    (lambda: col.allreduce(np.ones(4), algorithm="hierarchical"),
     "allreduce: algorithm: 'hierarchical' cannot run this call: this group's ranks are not on several hosts"),
    (lambda: col.algorithm_for("alltoall", np.ones(4)), "algorithm_for: collective: expected one of"),
])
def test_an_algorithm_that_cannot_run_is_a_usage_error_on_every_rank(call, message):
    if "hierarchical" in message and col.algorithm_for("allreduce", np.ones(1 << 20)) == "hierarchical":
        pytest.skip("the world spans hosts here")
    with pytest.raises(col.CollectiveUsageError, match=message):
        call()
    agree(col.allreduce(np.ones(2)).tolist() == [N, N], "the next call was out of step")


def test_block_bounds_are_the_reduce_scatter_blocks():
    for count in (0, 1, N + 1, 1001):
        x = rank_input(count, "int32", "sum")
        start, stop = col.block_bounds(count)[RANK]
        agree(np.array_equal(col.reduce_scatter(x), mpi_reference(x, "sum")[start:stop]), f"x{count}: block")
    agree(col.block_bounds(10, 3) == ((0, 4), (4, 7), (7, 10)), "block_bounds(10, 3)")


def test_to_host_copies_and_synchronize_waits():
    x = np.arange(5.0)
    host = col.to_host(x)
    col.synchronize(x)
    agree(np.array_equal(host, x) and not np.shares_memory(host, x), "to_host did not copy")


def test_a_group_runs_its_collectives_and_the_module_functions_are_the_worlds():
    evens = col.new_group(range(0, N, 2))
    x = np.full(3, RANK + 1.0)
    problems = []
    if evens:
        expected = np.full(3, sum(r + 1.0 for r in range(0, N, 2)))
        if not np.array_equal(evens.allreduce(x), expected):
            problems.append("the group's method")
        if not np.array_equal(col.allreduce(x, group=evens), expected):
            problems.append("group= of the module function")
        if evens.algorithm_for("allreduce", x) != col.algorithm_for("allreduce", x, group=evens):
            problems.append("algorithm_for")
        evens.destroy()
        with pytest.raises(col.CollectiveUsageError, match="was destroyed"):
            evens.allreduce(x)
    agree(not problems, f"wrong: {problems}")
    agree(np.array_equal(col.allreduce(x), np.full(3, N * (N + 1) / 2)), "the world's call after the group's")


def test_the_world_group_is_the_group_of_the_module_functions():
    world = col.world_group()
    x = np.full(3, RANK + 1.0)
    same = (isinstance(world, col.Group) and world is col.world_group() and (world.rank(), world.size()) == (RANK, N)
            and np.array_equal(world.allreduce(x), col.allreduce(x))
            and np.array_equal(col.allreduce(x, group=world), col.allreduce(x)))
    agree(same, "col.world_group() is not the world the module functions run on")
