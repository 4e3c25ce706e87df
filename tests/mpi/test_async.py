"""Tier 2, issue 13: nonblocking collectives (async_op=True, Work) and allreduce_many, in real
worlds of 1..4 ranks, against the blocking calls and mpi4py's own collectives. Every wait is
bounded (timeout=), so a regression fails instead of hanging."""
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from tests.support.in_world import N, RANK, agree, mpi_reference, rank_input, same_on_every_rank


pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
BOUND_S = 30
SIZES = [0, 1, N + 1, 1001, 300_001]   # small path, ring path


def _blocking_and_async(call):
    """``call(async_op)`` both ways, on fresh inputs each time; returns (blocking result, async result)."""
    blocking = call(False)
    work = call(True)
    agree(isinstance(work, col.Work), f"async_op=True returned {type(work).__name__}, not a Work")
    return blocking, work.wait(timeout=BOUND_S)


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_async_allreduce_and_reduce_scatter_equal_the_blocking_calls(op):
    for count in SIZES:
        x = rank_input(count, "float32", op)
        blocking, async_ = _blocking_and_async(lambda a: col.allreduce(x, op=op, async_op=a, timeout=BOUND_S))
        agree(np.array_equal(blocking, async_), f"allreduce {op} count={count}: async differs from blocking")
        agree(np.array_equal(async_, mpi_reference(x, op)) or op == "avg", f"allreduce {op} {count}: differs from MPI")
        agree(same_on_every_rank(async_), f"allreduce {op} count={count}: ranks got different bits")
        blocking, async_ = _blocking_and_async(lambda a: col.reduce_scatter(x, op=op, async_op=a, timeout=BOUND_S))
        agree(np.array_equal(blocking, async_), f"reduce_scatter {op} count={count}: async differs from blocking")


def test_async_allgather_broadcast_barrier_equal_the_blocking_calls():
    for rows in (0, 1, 1000, 70_000):
        x = np.arange(rows * 3, dtype=np.int64).reshape(rows, 3) + RANK
        blocking, async_ = _blocking_and_async(lambda a: col.allgather(x, async_op=a, timeout=BOUND_S))
        agree(np.array_equal(blocking, async_) and np.array_equal(async_, np.concatenate(COMM.allgather(x))),
              f"allgather rows={rows}: async differs")
        root = N - 1
        blocking, async_ = _blocking_and_async(
            lambda a: col.broadcast(x.copy(), root=root, async_op=a, timeout=BOUND_S))
        agree(np.array_equal(blocking, async_) and np.array_equal(async_, COMM.bcast(x, root=root)),
              f"broadcast rows={rows}: async differs")
    agree(col.barrier(async_op=True, timeout=BOUND_S).wait(timeout=BOUND_S) is None, "barrier's wait returned something")


def test_many_handles_in_flight_waited_in_another_order_than_issued():
    inputs = [rank_input(count, "float64", "sum") * (k + 1) for k, count in enumerate([10, 200_000, 3, 70_000] * 3)]
    works = [col.allreduce(x, async_op=True, timeout=BOUND_S, name=f"in flight {k}") for k, x in enumerate(inputs)]
    gathered = col.allgather(np.array([RANK]), async_op=True, timeout=BOUND_S)
    blocking = col.allreduce(np.array([RANK + 1.0]), timeout=BOUND_S)   # ordered after every handle above
    agree(all(w.is_completed() for w in works), "a blocking call returned before the handles issued before it")
    order = list(range(len(works)))[::-2] + list(range(len(works)))[::2]
    results = {k: works[k].wait(timeout=BOUND_S) for k in order}
    for k, x in enumerate(inputs):
        agree(np.array_equal(results[k], mpi_reference(x, "sum")), f"handle {k} got another call's result")
    agree(np.array_equal(gathered.wait(timeout=BOUND_S), np.arange(N)), "allgather handle")
    agree(blocking[0] == N * (N + 1) / 2, "blocking call after handles")
    seqs = [w.seq for w in works]
    agree(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"handles ran out of issue order: {seqs}")


def test_compute_while_in_flight_finishes_without_calling_the_runtime():
    x = rank_input(4_000_000, "float32", "sum")   # 16 MB: the ring, many segments
    work = col.allreduce(x, async_op=True, timeout=BOUND_S)
    a = np.random.default_rng(RANK).standard_normal((400, 400))
    deadline = time.monotonic() + BOUND_S
    while not work.is_completed() and time.monotonic() < deadline:
        a = np.tanh(a @ a.T / 400)   # numpy releases the GIL: the engine thread moves the data meanwhile
    agree(work.is_completed(), f"the handle did not complete while this rank computed for {BOUND_S} s")
    agree(np.array_equal(work.wait(timeout=BOUND_S), mpi_reference(x, "sum")), "result after compute")


def test_allreduce_many_equals_one_allreduce_per_array():
    shapes = [(3, 4), (N + 2,), (), (1000,), (2, 0), (30_000,)]
    dtypes = ["float32", "float64", "int32", "float32", "float32", "float64"]
    for op in ("sum", "max", "prod"):
        arrays = [rank_input(int(np.prod(s)), d, op).reshape(s) for s, d in zip(shapes, dtypes)]
        expected = [mpi_reference(a, op) for a in arrays]
        for a in (False, True):
            given = [x.copy() for x in arrays]
            given[1] = np.asfortranarray(np.stack([given[1], given[1]]))[0]   # a strided view
            returned = col.allreduce_many(given, op=op, async_op=a, timeout=BOUND_S)
            returned = returned.wait(timeout=BOUND_S) if a else returned
            agree(returned is given and all(np.array_equal(g, e) for g, e in zip(given, expected)),
                  f"allreduce_many {op} async={a}: differs from MPI")


def test_allreduce_many_of_views_of_one_buffer_in_place():
    flat = rank_input(10_000, "float32", "sum")
    expected = mpi_reference(flat, "sum")
    views = [flat[:100].reshape(10, 10), flat[100:5000], flat[5000:]]
    col.allreduce_many(views, timeout=BOUND_S)
    agree(np.array_equal(flat, expected), "views of one buffer, reduced in place")


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_a_mismatch_raises_from_wait_on_every_rank():
    count = 300_001 if RANK == N - 1 else 300_000
    work = col.allreduce(np.ones(count, np.float32), async_op=True, timeout=BOUND_S)
    try:
        work.wait(timeout=BOUND_S)
        message = ""
    except col.CollectiveUsageError as e:
        message = str(e)
    agree("allreduce: x: count differs across ranks" in message, f"wait raised {message!r}")
    agree(np.array_equal(col.allreduce(np.ones(3), timeout=BOUND_S), np.full(3, N)), "the next call after it")


def test_a_usage_error_raises_from_wait_and_a_bad_async_op_at_once():
    work = col.allreduce(np.ones(3, np.int32), op="avg", async_op=True, timeout=BOUND_S)
    with pytest.raises(col.CollectiveUsageError, match="'avg' needs a floating dtype"):
        work.wait(timeout=BOUND_S)
    with pytest.raises(col.CollectiveUsageError, match="allreduce: async_op: expected True or False, got 'yes'"):
        col.allreduce(np.ones(3), async_op="yes", timeout=BOUND_S)
    with pytest.raises(col.CollectiveUsageError, match="wait: timeout: expected a positive number"):
        col.barrier(async_op=True, timeout=BOUND_S).wait(timeout=-1)
    with pytest.raises(col.CollectiveUsageError, match=r"arrays\[0\] and arrays\[1\] share memory"):
        x = np.ones(10)
        col.allreduce_many([x[:6], x[4:]], timeout=BOUND_S)


def test_a_dropped_handle_still_runs_in_its_turn_and_later_calls_are_right():
    x = rank_input(200_000, "float32", "sum")
    expected = mpi_reference(x, "sum")
    target = np.empty_like(x)
    col.allreduce(x, out=target, async_op=True, timeout=BOUND_S)   # never waited for
    after = col.allreduce(np.array([float(RANK)]), timeout=BOUND_S)
    agree(np.array_equal(target, expected), "the dropped handle's result did not land")
    agree(after[0] == N * (N - 1) / 2, "the call after a dropped handle")


def test_calls_from_two_threads_with_handles_in_flight():
    errors, results = [], {}

    def worker(tag):
        try:
            works = [col.allreduce(np.full(1000, RANK + k, np.float64), async_op=True, timeout=BOUND_S,
                                   name=f"{tag} {k}") for k in range(3)]
            results[tag] = [w.wait(timeout=BOUND_S)[0] for w in works]
        except Exception as e:   # noqa: BLE001 (reported below, on every rank)
            errors.append(repr(e))

    thread = threading.Thread(target=worker, args=("thread",), name="worker")
    thread.start()
    thread.join(timeout=BOUND_S)
    worker("main")
    expected = [N * (N - 1) / 2 + N * k for k in range(3)]
    agree(not errors and results.get("thread") == expected and results.get("main") == expected,
          f"{errors} {results}")
