"""Tier 2, issue 61: the express lanes of a repeated small all-reduce, broadcast and all-gather
(``collectives.ops.express``) give the bits of the usual way and of mpi4py's own, keep the cross-rank
check and the usage errors, and give way where the settings change. Runs at every world size."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives.calls import call as call_module
from collectives.calls.call import BACK_TO_BACK_SECONDS, PAUSE_SECONDS
from collectives.ops import express
from collectives.ops import fused as fused_module

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
ODD = RANK == N - 1
REFERENCE_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def _contribution(shape, dtype, step):
    """Integer values that depend on the rank and the step (exact sums and products in any order)."""
    count = int(np.prod(shape))
    return ((np.arange(count) * (RANK + 2) + step) % 5 + 1).astype(dtype).reshape(shape)


def _reference(x, op):
    if op == "avg":
        total = np.empty_like(x)
        COMM.Allreduce(x, total, op=MPI.SUM)
        return (total / N).astype(x.dtype)
    result = np.empty_like(x)
    COMM.Allreduce(x, result, op=REFERENCE_OPS[op])
    return result


def _lane_taken(x, op, out=None) -> bool:
    return express.allreduce_lane(col.world_group(), x, op, out) is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8, np.float16])
@pytest.mark.parametrize("op", ["sum", "avg", "max", "prod"])
@pytest.mark.parametrize("shape", [(3,), (2, 5), (1000,)])
@pytest.mark.parametrize("out_kind", ["new", "in place", "own out"])
def test_a_repeated_small_allreduce_takes_the_lane_with_the_usual_bits(dtype, op, shape, out_kind):
    if op == "avg" and np.dtype(dtype).kind != "f":
        pytest.skip("avg is for floating-point data")
    for step in range(4):
        x = _contribution(shape, dtype, step)
        expected = _reference(x, op)
        usual = col.allreduce(x, op, timeout=60)   # (an option: the usual way, never the lane)
        assert usual.tobytes() == expected.tobytes() or np.dtype(dtype).kind == "f" and op == "avg"
        out = {"new": None, "in place": x, "own out": np.full(shape, 99, dtype)}[out_kind]
        if step > 0:
            assert _lane_taken(x, op, out), "the lane was not taken for a call it had served before"
        got = col.allreduce(x, op, out=out)
        assert got.shape == shape and got.dtype == dtype
        assert got.tobytes() == usual.tobytes()                 # the same bits as the usual way ...
        if out is not None:
            assert got is out
        every = COMM.allgather(got.tobytes())
        assert every == [every[0]] * N                          # ... on every rank


def test_a_call_that_differs_across_ranks_is_refused_on_every_rank_through_the_lane():
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    x = _contribution((4,), np.float32, 0)
    col.allreduce(x)
    assert _lane_taken(x, "sum")
    mine = _contribution((5,), np.float32, 0) if ODD else x   # (the odd rank's has no lane: the usual way)
    with pytest.raises(col.CollectiveUsageError, match=rf"allreduce: x: count differs across ranks: rank 0: 4, "
                                                       rf"rank {N - 1}: 5"):
        col.allreduce(mine)
    op = "max" if ODD else "sum"
    with pytest.raises(col.CollectiveUsageError, match=rf"op differs across ranks: rank 0: sum, rank {N - 1}: max"):
        col.allreduce(x, op)
    assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()   # (in step again)


@pytest.mark.parametrize("bad_out, says", [
    (lambda x: np.empty(x.shape, np.float64), "out"),
    (lambda x: np.empty(x.size + 1, x.dtype), "out"),
    (lambda x: x[::-1], "out"),                   # overlaps x
    (lambda x: np.frombuffer(bytes(x.nbytes), x.dtype), "out"),   # read-only
])
def test_a_bad_out_after_the_lane_opened_is_the_usual_usage_error(bad_out, says):
    x = _contribution((6,), np.float32, 1)
    col.allreduce(x)
    before = x.copy()
    with pytest.raises(col.CollectiveUsageError, match=rf"allreduce: {says}"):
        col.allreduce(x, out=bad_out(x))
    assert np.array_equal(x, before)
    assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()


def test_a_read_only_x_reduced_in_place_is_refused_through_the_lane():
    x = _contribution((6,), np.float64, 2)
    col.allreduce(x, out=x)
    x.flags.writeable = False
    assert not _lane_taken(x, "sum", x)
    with pytest.raises(col.CollectiveUsageError, match="allreduce: out"):
        col.allreduce(x, out=x)


def test_the_lanes_follow_the_settings():
    x = _contribution((8,), np.float32, 3)
    col.allreduce(x)
    assert _lane_taken(x, "sum")
    small = col.settings().small_bytes
    col.init(small_bytes=0)   # (every rank together: recursive doubling is no longer chosen)
    try:
        assert not _lane_taken(x, "sum")
        col.allreduce(x)
        lane = express.allreduce_lane(col.world_group(), x, "sum", None)
        assert lane is None or N == 2 and lane.halves is not None, \
            "a doubling lane opened for a call the settings give another algorithm (two ranks: halving's lane)"
        assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()
    finally:
        col.init(small_bytes=small)
    col.allreduce(x)
    lane = express.allreduce_lane(col.world_group(), x, "sum", None)
    assert lane is not None and lane.halves is None


def test_lanes_of_several_kinds_in_turn_and_call_numbers_that_gain_digits_keep_the_bits():
    """Kinds taken in turn (the lane that ran last is compared before the lookup), on the world and
    on a group of half the ranks, with a dtype equal to the lane's but another object, over enough
    calls that the call's number gains digits (the header's template is remade at 10, 100, ...):
    each call against mpi4py's."""
    group, halves = col.world_group().split(RANK % 2), COMM.Split(RANK % 2)   # (odd and even ranks)
    tagged = np.dtype(np.float32, metadata={"units": "m"})   # (== float32, but another object)
    kinds = [((3,), np.float32, "sum", None), ((3,), np.float32, "sum", group), ((4,), np.float32, "sum", None),
             ((3,), np.float64, "sum", None), ((3,), np.float32, "max", None), ((3,), tagged, "sum", None)]
    for step in range(130):
        shape, dtype, op, on = kinds[step % len(kinds)]
        x = _contribution(shape, np.float32 if dtype is tagged else dtype, step)
        if dtype is tagged:
            x = x.view(tagged)
        got = col.allreduce(x, op) if on is None else on.allreduce(x, op)
        if on is None:
            expected = _reference(x, op)
        else:
            expected = np.empty_like(x)
            halves.Allreduce(x, expected, op=REFERENCE_OPS[op])
        assert got.tobytes() == expected.tobytes(), (step, shape, dtype, op, on)
    x = _contribution((3,), np.float32, 0)
    assert _lane_taken(x, "sum") and express.allreduce_lane(group, x, "sum", None) is not None
    halves.Free()


@pytest.mark.parametrize("first, then", [("f4", "tagged"), ("q", "l"), ("l", "q")])
def test_a_result_from_the_lane_has_the_dtype_of_its_own_x(first, then):
    """A lane serves every dtype equal to the one that opened it; each result has its own x's dtype
    (its metadata, its character), as the usual way's does, whatever call opened the lane."""
    kinds = {"f4": np.dtype(np.float32), "tagged": np.dtype(np.float32, metadata={"units": "m"}),
             "q": np.dtype("q"), "l": np.dtype("l")}
    if kinds[first] != kinds[then]:
        pytest.skip(f"{first} and {then} are not the same dtype on this platform")
    for name in (first, then, then):
        x = _contribution((3,), np.float32, 1).astype(kinds[name])
        got = col.allreduce(x)
        assert got.dtype == x.dtype and got.dtype.char == x.dtype.char and got.dtype.metadata == x.dtype.metadata


def test_the_lane_is_for_the_main_thread_and_calls_without_options():
    x = _contribution((3,), np.float32, 4)
    col.allreduce(x)
    assert _lane_taken(x, "sum")
    work = col.allreduce(x, async_op=True)     # (async, named, timed: each the usual way, in step)
    assert work.wait().tobytes() == col.allreduce(x, name="metric").tobytes() == _reference(x, "sum").tobytes()


@pytest.mark.parametrize("op", [["sum"], {"op": "sum"}, np.array([1]), b"sum"])
def test_an_op_of_another_type_is_the_usual_usage_error_on_every_rank(op):
    x = _contribution((2,), np.float32, 5)
    col.allreduce(x)
    mine = op if ODD else "sum"   # (one rank's typo: the others hear of it and raise too)
    with pytest.raises(col.CollectiveUsageError, match="allreduce: op"):
        col.allreduce(x, mine)
    assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()   # (in step again)


@pytest.mark.parametrize("op", ["sum", "min", "avg"])
@pytest.mark.parametrize("algorithm, count, lane_where", [
    ("doubling", 1000, range(1, 9)), ("halving", 1000, [2]), ("halving", 50_001, [2]), ("ring", 1001, [2])])
def test_an_allreduce_that_forces_an_algorithm_takes_a_lane_kept_for_it_with_the_usual_bits(algorithm, count,
                                                                                               lane_where, op):
    """``algorithm=`` is no option that keeps a call off the lanes: a repeated call that forces one takes
    a lane kept for that algorithm (the ring's all-reduce only on two ranks, where its messages are
    halving's), and a call that forces none never takes it (nor the other way round). Random data,
    signed zeros among it: the bits tell the order of every combination."""
    g = col.world_group()
    for step in range(3):
        x = np.random.default_rng([RANK, step]).uniform(-2, 2, count).astype(np.float32)
        x[::7] = 0.0 if RANK % 2 else -0.0
        usual = col.allreduce(x.copy(), op, algorithm=algorithm, timeout=60)
        if op != "avg":
            assert np.array_equal(usual, _reference(x, op)) or N > 2   # (MPI's order, beyond two ranks; and
            # the sign of a zero minimum is the order's: bits are compared with the usual way's below)
        if step > 0:
            lane = express.allreduce_lane(g, x, op, None, algorithm)
            assert (lane is not None) == (N in lane_where), lane
            unforced = express.allreduce_lane(g, x, op, None)   # (kept for the calls that force it:)
            assert unforced is None or unforced.forced is None
        assert col.allreduce(x, op, algorithm=algorithm).tobytes() == usual.tobytes()
    col.allreduce(x, op)   # (the runtime's choice: a lane of its own takes the place ...)
    assert express.allreduce_lane(g, x, op, None, algorithm) is None
    assert col.allreduce(x, op, algorithm=algorithm).tobytes() == usual.tobytes()   # (... and gives it back)


@pytest.mark.parametrize("collective", ["broadcast", "allgather"])
@pytest.mark.parametrize("count", [3, 40_000])
def test_a_broadcast_or_allgather_that_forces_an_algorithm_takes_a_lane_kept_for_it(collective, count):
    x = _contribution((count,), np.int32, RANK)
    g = col.world_group()
    if collective == "broadcast":
        expected = COMM.bcast(x, 0)
        run = lambda **kw: col.broadcast(x.copy(), 0, **kw)   # noqa: E731
        find = lambda a: express.broadcast_lane(g, x, 0, a)   # noqa: E731
    else:
        expected = np.concatenate(COMM.allgather(x))
        run = lambda **kw: col.allgather(x, **kw)   # noqa: E731
        find = lambda a: express.allgather_lane(g, x, None, a)   # noqa: E731
    for algorithm in ("doubling", "ring"):
        if algorithm == "doubling" and count > 20_000:
            continue   # (above the doubling's sizes it cannot carry the call)
        for step in range(3):
            if step > 0:
                assert (find(algorithm) is not None) == (algorithm == "doubling" or N == 2)
                assert find(None) is None or find(None).forced is None
            assert run(algorithm=algorithm).tobytes() == expected.tobytes()


def test_ranks_that_force_different_algorithms_are_refused_on_every_rank_from_a_lane_too():
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    x = _contribution((4,), np.float32, 0)
    col.allreduce(x, algorithm="doubling")   # (every rank keeps a lane for the calls that force it)
    forced = "doubling" if ODD else None     # (the odd rank takes it, the others the usual way)
    assert (express.allreduce_lane(col.world_group(), x, "sum", None, forced) is not None) == ODD
    for _ in range(2):
        with pytest.raises(col.CollectiveUsageError, match=rf"algorithm differs across ranks: rank 0: -, "
                                                           rf"rank {N - 1}: doubling"):
            col.allreduce(x, algorithm=forced)
    assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()   # (in step again)


def _broadcast_lane_taken(x, root) -> bool:
    return express.broadcast_lane(col.world_group(), x, root) is not None


def _allgather_lane_taken(x, out=None) -> bool:
    return express.allgather_lane(col.world_group(), x, out) is not None


def test_broadcast_and_allgather_lanes_of_several_kinds_in_turn_keep_the_bits():
    """Broadcasts and all-gathers of several kinds in turn (the lane of each collective that ran last
    is compared before the lookup: ``express._kept``), through the module functions and a group's
    methods, on the world and on half the ranks, with roots, shapes, dtypes (one equal to the lane's
    but another object) and ``out`` rows that change from call to call: each against mpi4py's."""
    group, halves = col.world_group().split(RANK % 2), COMM.Split(RANK % 2)
    tagged = np.dtype(np.float32, metadata={"units": "m"})   # (== float32, but another object)
    kinds = [((3,), np.float32, 0, None), ((3,), np.float32, N - 1, None), ((3,), np.float32, 0, group),
             ((4,), np.float32, 0, None), ((3,), np.int64, 0, None), ((3,), tagged, N - 1, None),
             ((2, 3), np.float32, 0, None)]
    for step in range(6 * len(kinds)):   # (each kind twice in a row, then the next)
        shape, dtype, root, on = kinds[step // 2 % len(kinds)]
        comm = COMM if on is None else halves
        root %= comm.Get_size()
        x = _contribution(shape, np.float32 if dtype is tagged else dtype, step)
        if dtype is tagged:
            x = x.view(tagged)
        sent = x.copy()
        gathered = np.empty((comm.Get_size(),) + shape, x.dtype)
        comm.Allgather(sent, gathered)
        out = np.full((comm.Get_size() * shape[0],) + shape[1:], 7, x.dtype) if step % 2 else None
        got = col.allgather(x, out=out) if on is None else on.allgather(x, out=out)
        assert got.tobytes() == gathered.tobytes(), ("allgather", step, shape, dtype, on)
        assert out is None or got is out
        expected = gathered[root]
        got = col.broadcast(x, root) if on is None else on.broadcast(x, root)
        assert got is x and x.tobytes() == expected.tobytes(), ("broadcast", step, shape, dtype, root, on)
    halves.Free()


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16])
@pytest.mark.parametrize("shape", [(3,), (2, 5), (1000,)])
def test_a_repeated_small_broadcast_takes_the_lane_with_the_usual_bits(dtype, shape):
    for step in range(4):
        root = (step * 2 + 1) % N   # (a few roots; each its own lane)
        x = _contribution(shape, dtype, step)
        expected = COMM.bcast(x, root=root)
        usual = x.copy()
        col.broadcast(usual, root, timeout=60)   # (an option: the usual way)
        assert usual.tobytes() == expected.tobytes()
        mine = x.copy()
        if step >= N:   # (every root's lane opened by now)
            assert _broadcast_lane_taken(mine, root), "the lane was not taken for a call it had served before"
        assert col.broadcast(mine, root) is mine
        assert mine.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.float64])
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 5), (200, 3)])
@pytest.mark.parametrize("out_kind", ["new", "own out"])
def test_a_repeated_small_allgather_takes_the_lane_with_the_usual_bits(dtype, shape, out_kind):
    for step in range(4):
        x = _contribution(shape, dtype, step)
        expected = np.concatenate(COMM.allgather(x))
        usual = col.allgather(x, timeout=60)
        assert usual.tobytes() == expected.tobytes()
        out = None if out_kind == "new" else np.full(expected.shape, 7, dtype)
        if step > 0:
            assert _allgather_lane_taken(x, out), "the lane was not taken for a call it had served before"
        got = col.allgather(x, out=out)
        assert got.shape == expected.shape and got.dtype == dtype and got.tobytes() == expected.tobytes()
        if out is not None:
            assert got is out


@pytest.mark.parametrize("dtype, shape", [(np.float32, (70_000,)), (np.int16, (400, 401)), (np.uint8, (300_000,))])
def test_a_repeated_broadcast_the_ring_carries_takes_the_direct_lane_on_two_ranks(dtype, shape):
    """Above the doubling's sizes, on two ranks, the lane sends the ring's one message straight from
    the root's array into the other's, after the check's exchange: the bits of mpi4py's, every root."""
    for step in range(5):
        root = step % N
        x = _contribution(shape, dtype, step)
        expected = x.copy()
        COMM.Bcast(expected, root=root)
        mine = x.copy()
        if step >= N:
            lane = express.broadcast_lane(col.world_group(), mine, root)
            assert (lane is not None and lane.direct) if N == 2 else lane is None or N == 1, lane
        assert col.broadcast(mine, root) is mine
        assert mine.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype, shape", [(np.float32, (40_000,)), (np.int64, (100, 300))])
@pytest.mark.parametrize("out_kind", ["new", "own out"])
def test_a_repeated_allgather_the_ring_carries_takes_the_direct_lane_on_two_ranks(dtype, shape, out_kind):
    for step in range(4):
        x = _contribution(shape, dtype, step)
        expected = np.concatenate(COMM.allgather(x))
        out = None if out_kind == "new" else np.full(expected.shape, 7, dtype)
        if step > 0:
            lane = express.allgather_lane(col.world_group(), x, out)
            assert (lane is not None and lane.message.size == 16) if N == 2 else lane is None or N == 1, lane
        got = col.allgather(x, out=out)
        assert got.shape == expected.shape and got.dtype == dtype and got.tobytes() == expected.tobytes()
        if out is not None:
            assert got is out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("op", ["sum", "max", "prod", "avg"])
@pytest.mark.parametrize("shape", [(50_001,), (300, 201)])   # (odd: the halves differ by one)
@pytest.mark.parametrize("out_kind", ["new", "in place", "own out"])
def test_a_repeated_allreduce_that_halving_carries_takes_the_direct_lane_on_two_ranks(dtype, op, shape, out_kind):
    """Above the doubling's sizes, on two ranks, halving's two messages go straight between the arrays
    after the check's exchange: the bits of the usual way (each half reduced once, by its owner) and
    mpi4py's, in place too; "avg" as the usual way rounds it (float16 divides each contribution first,
    wider types the sum once: random data, whose bits tell the two apart)."""
    if op == "avg" and np.dtype(dtype).kind != "f":
        pytest.skip("avg is for floating-point data")
    for step in range(3):
        if op == "avg":
            x = np.random.default_rng([RANK, step]).uniform(-3, 3, shape).astype(dtype)
        else:
            x = _contribution(shape, dtype, step)
        usual = col.allreduce(x.copy(), op, timeout=60)
        if op != "avg":
            assert usual.tobytes() == _reference(x, op).tobytes()
        out = {"new": None, "in place": x, "own out": np.full(shape, 9, dtype)}[out_kind]
        if step > 0:
            lane = express.allreduce_lane(col.world_group(), x, op, out)
            if N == 2:
                assert lane is not None and lane.halves is not None, lane
            elif N > 2:
                assert lane is None, lane
        got = col.allreduce(x, op, out=out)
        assert got.tobytes() == usual.tobytes(), (step, out_kind)
        if out is not None:
            assert got is out


@pytest.mark.parametrize("view", [lambda big: big[::2], lambda big: big[::-1][::2], lambda big: big.reshape(-1, 2)[:, :1]])
@pytest.mark.parametrize("out_kind", ["new", "own out"])
def test_a_strided_x_after_a_direct_allreduce_lane_opened_is_reduced_the_usual_way(view, out_kind):
    """Halving's lane sends from x itself: a strided x of the lane's kind takes the usual way (which
    copies it), on two ranks and elsewhere alike."""
    count = 70_000
    big = _contribution((2 * count,), np.float32, 1)
    shape = view(big).shape
    col.allreduce(np.ascontiguousarray(view(big)))   # (a contiguous x of that kind opens the lane)
    x = view(big)
    out = None if out_kind == "new" else np.empty(shape, np.float32)
    got = col.allreduce(x, out=out)
    assert got.tobytes() == _reference(np.ascontiguousarray(x), "sum").tobytes()
    assert col.allreduce(np.ascontiguousarray(x)).tobytes() == got.tobytes()   # (in step again)


@pytest.mark.parametrize("view", [lambda big: big[::2], lambda big: big.reshape(-1, 2)[:, :1]])
def test_a_strided_x_after_a_direct_broadcast_lane_opened_is_broadcast_the_usual_way(view):
    """The direct broadcast's lane (and one function) sends from and receives into x itself: a strided x
    of the lane's kind takes the usual way, which writes the root's bits into it on every rank."""
    count = 70_000
    for step in range(4):   # (the lane opens, then its one function; then the strided one)
        col.broadcast(_contribution((count,), np.float32, step), 0)
    big = _contribution((2 * count,), np.float32, RANK + 1)
    before, x = big.copy(), view(big)
    expected = np.ascontiguousarray(x)
    COMM.Bcast(expected, 0)
    assert col.broadcast(x, 0) is x
    assert x.tobytes() == expected.tobytes()
    outside = np.ones(big.size, bool)
    outside[view(np.arange(big.size)).reshape(-1)] = False   # (the elements that x does not view: as they were)
    assert big[outside].tobytes() == before[outside].tobytes()


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("count", [3, 1000, 80_000])   # (doubling; the pair's messages; the ring's, direct)
def test_a_rank_on_the_lane_and_a_rank_on_the_usual_way_send_the_same_messages(count, check):
    """A lane's messages are the usual way's, with the cross-rank check on or off: in one call some
    ranks may take the lane while others, passing an option that the signature does not hold
    (``timeout=``), take the usual way."""
    was = col.settings().check
    col.init(check=check)   # (every rank together)
    try:
        x = _contribution((count,), np.float32, 3)
        col.allreduce(x), col.broadcast(x.copy(), 0), col.allgather(x)   # (the lanes open)
        for step in range(4):
            usual = {"timeout": 60} if (RANK + step) % 2 else {}
            x = _contribution((count,), np.float32, step)
            assert col.allreduce(x, **usual).tobytes() == _reference(x, "sum").tobytes()
            mine = x.copy()
            col.broadcast(mine, step % N, **usual)
            assert mine.tobytes() == COMM.bcast(x, root=step % N).tobytes()
            assert col.allgather(x, **usual).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()
            for algorithm in ("halving", "ring") if count > 3 else ():   # (forced: lanes kept for them)
                got = col.allreduce(x, algorithm=algorithm, **usual)
                assert got.tobytes() == _reference(x, "sum").tobytes(), algorithm
    finally:
        col.init(check=was)


@pytest.mark.parametrize("algorithm", ["halving", "ring"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_a_forced_allreduce_of_a_few_elements_sends_the_usual_messages_from_its_lane(count, algorithm):
    """Halving (or the ring) of one element on two ranks has an empty half, for which the usual way
    sends no message. The lane sent a message of nothing there, which a rank on the usual way (its call
    passed ``timeout=``) took for the other's real one: a wrong sum on one rank and a disagreement, or
    a wait to the timeout, on the other (a tester's)."""
    x = _contribution((count,), np.float64, 2)
    for _ in range(3):   # (the lane opens, then is wired)
        assert col.allreduce(x, algorithm=algorithm).tobytes() == _reference(x, "sum").tobytes()
    for step in range(6):
        usual = {"timeout": 60} if (RANK + step) % 3 == 0 else {}
        x = _contribution((count,), np.float64, step)
        assert col.allreduce(x, algorithm=algorithm, **usual).tobytes() == _reference(x, "sum").tobytes()
        out = np.empty_like(x)
        assert col.allreduce(x, "max", out=out, algorithm=algorithm, **usual) is out
        assert out.tobytes() == _reference(x, "max").tobytes()


@pytest.mark.parametrize("rows", [2, 5000])   # (the pair's message; the direct lane, on two ranks)
def test_an_allgather_whose_rows_differ_across_ranks_goes_round_the_ring_from_either_lane(rows):
    x = _contribution((rows, 3), np.float32, 6)
    col.allgather(x)
    assert _allgather_lane_taken(x) or N > 2 and rows > 2
    mine = _contribution((rows + 2, 3), np.float32, 6) if ODD and N > 1 else x   # (the odd rank's: the usual way)
    got = col.allgather(mine)
    assert got.tobytes() == np.concatenate(COMM.allgather(mine)).tobytes()
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()   # (in step again)


@pytest.mark.parametrize("first_rows", [0, 1, 3])
def test_an_allgather_whose_rows_differed_opens_no_lane_for_the_next_whose_rows_are_alike(first_rows):
    """A call whose rows differ across ranks sends its data round the ring after the doubling; the next
    call of the same kind with every rank's rows alike takes the doubling on a rank that had no lane
    of that kind. Had the first call opened a lane of the ring's (the counts, then the rows straight
    into the result), the two ranks' messages would pair wrong: one rank returned another call's rows,
    the other waited for a message that never came."""
    before = col.settings().timeout
    col.init(timeout=20)   # (a wait for a message that never comes ends within the world's bound)
    try:
        for step in range(3):
            rows = first_rows if RANK == 0 and step == 0 else 2
            x = _contribution((rows, 1), np.float32, step)
            got = col.allgather(x)
            assert got.tobytes() == np.concatenate(COMM.allgather(x)).tobytes(), (step, rows)
    finally:
        col.init(timeout=before)


@pytest.mark.parametrize("count", [4, 80_000])
def test_a_large_broadcast_or_allgather_that_differs_across_ranks_is_refused_on_every_rank_through_the_lane(count):
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    x = _contribution((count,), np.float32, 0)
    col.broadcast(x.copy(), 0)
    col.allgather(x)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: root: root differs across ranks"):
        col.broadcast(x.copy(), 1 if ODD else 0)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: .*differs across ranks"):
        col.broadcast(np.concatenate([x, x]) if ODD else x.copy(), 0)
    with pytest.raises(col.CollectiveUsageError, match="allgather: .*differs across ranks"):
        col.allgather(x.astype(np.float64) if ODD else x)
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()   # (in step again)
    mine = x.copy()
    assert col.broadcast(mine, N - 1) is mine and mine.tobytes() == COMM.bcast(x, root=N - 1).tobytes()


def test_an_allgather_whose_rows_differ_across_ranks_goes_round_the_ring_from_the_lane():
    """The lane's guess (every rank brings as many rows) fails when one rank brings more: the counts
    tell every rank alike, and the data goes round the ring, as on the usual way."""
    x = _contribution((2, 3), np.float32, 6)
    col.allgather(x)
    assert _allgather_lane_taken(x)
    mine = _contribution((4, 3), np.float32, 6) if ODD and N > 1 else x   # (the odd rank's: the usual way)
    got = col.allgather(mine)
    assert got.tobytes() == np.concatenate(COMM.allgather(mine)).tobytes()
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()   # (in step again)


def test_a_broadcast_or_allgather_that_differs_across_ranks_is_refused_on_every_rank_through_the_lane():
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    x = _contribution((4,), np.float32, 0)
    col.broadcast(x.copy(), 0)
    col.allgather(x)
    with pytest.raises(col.CollectiveUsageError, match=rf"broadcast: root: root differs across ranks: rank 0: 0, "
                                                       rf"rank {N - 1}: 1"):
        col.broadcast(x.copy(), 1 if ODD else 0)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: .*differs across ranks"):
        col.broadcast(x.astype(np.float64) if ODD else x.copy(), 0)
    with pytest.raises(col.CollectiveUsageError, match="allgather: .*differs across ranks"):
        col.allgather(x.astype(np.float64) if ODD else x)
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()   # (in step again)


@pytest.mark.parametrize("bad_out, says", [
    (lambda x: np.empty((x.shape[0] * N + 1,) + x.shape[1:], x.dtype), "out: axis 0 must be"),
    (lambda x: np.empty((x.shape[0] * N,) + x.shape[1:], np.float64), "out"),
    (lambda x: np.frombuffer(bytes(x.nbytes * N), x.dtype).reshape((-1,) + x.shape[1:]), "out"),   # read-only
    (lambda x: x, "out"),                                                                       # x itself
])
def test_a_bad_out_after_the_allgather_lane_opened_is_the_usual_usage_error(bad_out, says):
    x = _contribution((3, 2), np.int32, 1)
    col.allgather(x, out=np.empty((3 * N, 2), np.int32))   # (the lane of an out with these rows)
    before = x.copy()
    with pytest.raises(col.CollectiveUsageError, match=rf"allgather: {says}"):
        col.allgather(x, out=bad_out(x))
    assert np.array_equal(x, before)
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()


def test_a_read_only_x_that_a_broadcast_would_write_is_refused_through_the_lane():
    if N < 2:
        pytest.skip("a world of one writes nothing")
    x = _contribution((5,), np.float32, 2)
    col.broadcast(x.copy(), 0)
    mine = x.copy()
    mine.flags.writeable = RANK == 0   # (the root's may be read-only: it is only read)
    assert _broadcast_lane_taken(mine, 0) == (RANK == 0)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: x"):
        col.broadcast(mine, 0)
    assert col.allgather(x).tobytes() == np.concatenate(COMM.allgather(x)).tobytes()   # (in step again)


def test_a_lane_whose_ready_exchange_was_freed_makes_it_again():
    """The transport keeps at most 64 ready exchanges and frees them all when a 65th comes (on two
    ranks the lane holds one, ``MPITransport.persistent``): the lane's next call makes it again and
    gives the usual bits."""
    first = _contribution((3,), np.float32, 1)
    col.allreduce(first)
    col.allreduce(first)   # (the lane's exchange made ready)
    for count in range(1, 70):   # (each size its own message, so its own ready exchange; the usual way,
        x = _contribution((count,), np.int64, count)   # as an option opens no lane: 64 lanes at most too)
        assert col.allreduce(x, timeout=60).tobytes() == _reference(x, "sum").tobytes()
    for step in range(3):
        x = _contribution((3,), np.float32, step)
        assert _lane_taken(x, "sum")
        assert col.allreduce(x).tobytes() == _reference(x, "sum").tobytes()


def _count_served(runtime, collective: str, served: list) -> None:
    """From now on, put in ``served`` whether each call the runtime's one function of ``collective``
    (``collectives.ops.fused``) is given it serves (True) or leaves to the lane's lookup (False)."""
    fused = getattr(runtime, "fused_" + collective)
    if fused is None:
        return

    def counted(*args):
        result = fused(*args)
        served.append(result is not None)
        return result
    setattr(runtime, "fused_" + collective, counted)


@pytest.mark.parametrize("shape, dtype, op", [((2,), np.float32, "sum"), ((2, 3), np.int64, "max"),
                                              ((5,), np.float16, "prod"),
                                              ((50_001,), np.float32, "sum"), ((300, 201), np.int64, "max")])
@pytest.mark.parametrize("out_kind", ["new", "in place", "own out"])
def test_the_two_rank_lane_runs_as_one_function_with_the_usual_bits_as_its_numbers_gain_digits(shape, dtype, op,
                                                                                             out_kind):
    """On two ranks a repeated all-reduce runs as one function (``collectives.ops.fused``, from
    the lane's third call), small or (the last two kinds) halved straight between the arrays:
    120 calls on the same arrays, whose values change, each against mpi4py's
    (the call's number gains digits at 10 and 100: its header's template is remade), through the
    module function and the group's method alike."""
    x, own_out = np.empty(shape, dtype), np.empty(shape, dtype)
    runtime = col.world_group().runtime
    served = []
    for step in range(120):
        x[...] = _contribution(shape, dtype, step)
        expected = _reference(x, op)
        out = {"new": None, "in place": x, "own out": own_out}[out_kind]
        if step == 3 and N == 2:   # (count the calls the one function serves from here on)
            assert runtime.fused_allreduce is not None, "no one function for a lane on two ranks"
            _count_served(runtime, "allreduce", served)
        got = col.allreduce(x, op, out=out) if step % 2 else col.world_group().allreduce(x, op, out=out)
        assert got.tobytes() == expected.tobytes(), step
        assert out is None or got is out
    assert served == [True] * (117 if N == 2 else 0)


@pytest.mark.parametrize("shape, dtype", [((2,), np.float32), ((2, 3), np.int64), ((1,), np.float16), ((4,), np.bool_),
                                          ((40_000,), np.float32)])   # (the last: the direct lane's, after the counts)
@pytest.mark.parametrize("out_kind", ["new", "own out"])
@pytest.mark.parametrize("rows", ["alike", "the last rank's change"])
def test_the_two_rank_allgather_runs_as_one_function_with_mpi4pys_bits(shape, dtype, out_kind, rows):
    """On two ranks a repeated all-gather runs as one function too (``collectives.ops.fused``, from
    its lane's third call), small or direct: 60 calls on the same arrays, whose values change, each against mpi4py's,
    through the module function and the group's method alike. Where the last rank brings one row more
    from the 30th call on (another kind of call: the usual way there), the others' one function finds
    the counts it carries unlike its own, and the usual body finishes its call (where it brings no
    ``out``: one of the new size makes another kind of call there too)."""
    changing = rows != "alike" and ODD and N > 1
    arrays = [np.empty(shape, dtype), np.empty((shape[0] + changing,) + shape[1:], dtype)]
    runtime = col.world_group().runtime
    served, wrong = [], []
    for step in range(60):
        x = arrays[step >= 30]
        x[...] = _contribution(x.shape, dtype, step)
        expected = np.concatenate(COMM.allgather(x))
        out = {"new": None, "own out": np.empty_like(expected)}[out_kind]
        if step == 3 and N == 2:   # (count the calls the one function serves from here on)
            _count_served(runtime, "allgather", served)
        got = col.allgather(x, out=out) if step % 2 else col.world_group().allgather(x, out=out)
        if got.shape != expected.shape or got.tobytes() != expected.tobytes() or out is not None and got is not out:
            wrong.append(step)
    runtime.fused_allgather = None   # (the counter goes: the next call of a lane puts the one function back)
    if N != 2:
        as_expected = served == []
    elif changing or rows != "alike" and out_kind == "own out":   # (another kind from the 30th call: its
        # one function serves its first kind only, and a miss of the module's is tried twice)
        as_expected = served[:27] == [True] * 27 and not any(served[27:])
    else:
        as_expected = served == [True] * 57
    assert COMM.allgather((wrong, as_expected)) == [([], True)] * N   # (alike on every rank: none hangs)


@pytest.mark.parametrize("shape, dtype", [((2,), np.float32), ((2, 3), np.int64), ((1,), np.float16), ((4,), np.bool_),
                                          ((70_000,), np.float32)])   # (the last: the direct lane's, after the check)
@pytest.mark.parametrize("root", ["first", "last"])
def test_the_two_rank_broadcast_runs_as_one_function_with_mpi4pys_bits(shape, dtype, root):
    """On two ranks a repeated broadcast, small or direct, runs as one function too (``collectives.ops.fused``, from
    its lane's third call): 60 calls on the same array, whose values change on every rank, each against
    mpi4py's, through the module function and the group's method alike; the root's array stays as it
    was, the other's takes its bits."""
    root = 0 if root == "first" else N - 1
    x, runtime = np.empty(shape, dtype), col.world_group().runtime
    served, wrong = [], []
    for step in range(60):
        x[...] = _contribution(shape, dtype, step)
        expected = x.copy()
        COMM.Bcast(expected, root)
        if step == 3 and N == 2:   # (count the calls the one function serves from here on)
            _count_served(runtime, "broadcast", served)
        got = col.broadcast(x, root) if step % 2 else col.world_group().broadcast(x, root)
        if got is not x or x.tobytes() != expected.tobytes():
            wrong.append(step)
    runtime.fused_broadcast = None   # (the counter goes: the next call of a lane puts the one function back)
    as_expected = served == ([True] * 57 if N == 2 else [])
    assert COMM.allgather((wrong, as_expected)) == [([], True)] * N   # (alike on every rank: none hangs)


def _a_lanes_call(collective: str):
    """A small call of ``collective`` with no options, made three times: the usual way, the lane making
    its exchange ready, the lane (on two ranks, one function); the next ones take the lane."""
    x = _contribution((3,), np.float32, 1)
    call = {"allreduce": lambda: col.allreduce(x), "broadcast": lambda: col.broadcast(x, 0),
            "allgather": lambda: col.allgather(x)}[collective]
    for _ in range(3):
        call()
    return call


def _looks(monkeypatch) -> list:
    """From now on, each look of this rank for a give-up (``Control.check_gave_up``), as whether it drained."""
    control = col.world_group().transport.control
    seen = []
    looked = type(control).check_gave_up

    def counted(self, seq, drain=False, name=None):
        seen.append(drain)
        return looked(self, seq, drain, name)
    monkeypatch.setattr(type(control), "check_gave_up", counted)
    return seen


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
def test_a_lanes_call_after_a_pause_reads_the_others_words_before_it_sends(collective, monkeypatch):
    """A lane reuses its ``Call``: the pause before its next call is measured from that same call's start
    (``Call.renew``), and a call after a pause drains the control channel first (the others may have
    given it up meanwhile: docs/failures.md)."""
    if N < 2:
        pytest.skip("a world of one has no one to hear from")
    call = _a_lanes_call(collective)
    drains = _looks(monkeypatch)
    # (the look at a call's end drains too where the call lasted long, as it may here on a busy machine,
    # waiting for the others: not under test)
    monkeypatch.setattr(call_module.Call, "lasted_long", lambda self, now=None: False)
    time.sleep(3 * PAUSE_SECONDS)   # (the pause under test: the program's own work)
    call()
    assert drains.count(True) == 1, drains


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
@pytest.mark.parametrize("gap, looks", [(BACK_TO_BACK_SECONDS / 10, False), (BACK_TO_BACK_SECONDS * 10, True)])
def test_a_lanes_call_back_to_back_with_its_last_makes_no_look_for_a_new_give_up(collective, gap, looks,
                                                                                monkeypatch):
    """A lane's call whose look for a give-up would come within BACK_TO_BACK_SECONDS of the start of its
    own last call cannot find a new give-up (``collectives.ops.express``: "One look fewer"), and makes
    no look; one whose look comes later looks as the usual way does. The clock of the calls and the
    lanes is stepped by ``gap`` a reading, from the real one (their deadlines stay ahead), so that the
    test does not hang on this machine's speed."""
    call = _a_lanes_call(collective)
    started, steps = time.monotonic(), iter(range(1, 10 ** 6))
    for module in (call_module, express, fused_module):
        monkeypatch.setattr(module, "monotonic", lambda: started + next(steps) * gap)
    seen = _looks(monkeypatch)
    call()   # (its last began before the clock was stepped: a pause)
    del seen[:]
    for _ in range(20):
        call()
    monkeypatch.undo()
    assert seen == ([False] * 20 if looks else []), seen
