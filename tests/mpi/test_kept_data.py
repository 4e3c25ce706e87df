"""Tier 2, issue 61: a direct lane's data (on two ranks, the ring's one message of a broadcast or an
all-gather, straight between the arrays) goes over requests kept for the memory of a loop's arrays
(``express.Lane.move_data``): the bits of mpi4py's as the arrays' contents change, as calls bring other
arrays or new views of the same memory, for arrays of any layout, after a disagreement and after the
transport freed its kept exchanges; never the transport's framing in the caller's bytes; no array held,
so a program drops or resizes its arrays as before. Runs at every world size (kept requests on two
ranks; elsewhere the same bits by the usual way)."""
import gc
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives.ops import express

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
COUNT = 20_000   # (80 KiB of float32: above the doubling's sizes, so the ring's direct lane on two ranks)


def _count(dtype) -> int:
    """Elements of ``dtype`` in COUNT float32's bytes."""
    return COUNT * 4 // np.dtype(dtype).itemsize


def _contribution(count, dtype, step, rank=RANK):
    """Integer values that depend on the rank and the step."""
    return ((np.arange(count) * (rank + 2) + step) % 97 + 1).astype(dtype)


def _gathered(x):
    return np.concatenate(COMM.allgather(x))


def _lane(collective, x, out_or_root, algorithm=None, op="sum"):
    g = col.world_group()
    if collective == "broadcast":
        return express.broadcast_lane(g, x, out_or_root, algorithm)
    if collective == "allreduce":
        return express.allreduce_lane(g, x, op, out_or_root, algorithm)
    return express.allgather_lane(g, x, out_or_root, algorithm)


def _kept(collective, x, out_or_root, algorithm=None, op="sum") -> bool:
    """Whether the lane of this call holds requests kept for some memory (only on two ranks)."""
    lane = _lane(collective, x, out_or_root, algorithm, op)
    return lane is not None and any(ready.requests is not None for ready in lane.data.values())


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_an_allgather_into_its_own_out_keeps_requests_for_its_arrays_with_mpi4pys_bits_as_they_change(dtype):
    count = _count(dtype)
    x, out = np.empty(count, dtype), np.empty(count * N, dtype)
    for step in range(6):
        x[...] = _contribution(count, dtype, step)   # (new contents, the same arrays)
        out.fill(0)
        assert col.allgather(x, out=out) is out
        assert out.tobytes() == _gathered(x).tobytes()
        if step >= 2:
            assert _kept("allgather", x, out) == (N == 2)


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_a_broadcast_of_one_array_keeps_requests_for_it_with_mpi4pys_bits_as_it_changes(dtype):
    count = _count(dtype)
    x = np.empty(count, dtype)
    for step in range(6):
        x[...] = _contribution(count, dtype, step, rank=RANK + step)   # (each rank's own: only the root's counts)
        expected = COMM.bcast(x if RANK == 0 else None, root=0)
        assert col.broadcast(x, 0) is x
        assert x.tobytes() == expected.tobytes()
        if step >= 2:
            assert _kept("broadcast", x, 0) == (N == 2)


@pytest.mark.parametrize("order", ["ABABAB", "AABBAA", "ABBBAA"])
def test_calls_that_bring_other_arrays_let_the_kept_requests_go_and_keep_the_bits(order):
    arrays = {name: (np.empty(COUNT, np.int32), np.empty(COUNT * N, np.int32)) for name in "AB"}
    for step, name in enumerate(order):
        x, out = arrays[name]
        x[...] = _contribution(COUNT, np.int32, step)
        out.fill(-1)
        assert col.allgather(x, out=out).tobytes() == _gathered(x).tobytes()
        mine = x.copy()
        expected = COMM.bcast(mine if RANK == 0 else None, root=0)
        assert col.broadcast(mine, 0).tobytes() == expected.tobytes()


def test_a_loop_that_alternates_between_two_results_keeps_requests_for_both_and_makes_none_again():
    """A loop that holds its last result while it makes the next puts its data in two places by turns
    (``r = col.allgather(x)``: numpy places the new result beside the one still held): the requests of
    both are kept, made once each, not made again at every call as each place comes back."""
    x, outs = np.empty(COUNT, np.int32), [np.empty(COUNT * N, np.int32) for _ in range(2)]
    kept_for = {}   # (each place's kept requests, as first seen)
    for step in range(10):
        out = outs[step % 2]
        x[...] = _contribution(COUNT, np.int32, step)
        assert col.allgather(x, out=out).tobytes() == _gathered(x).tobytes()
        lane = _lane("allgather", x, out)
        if N == 2 and step >= 4:   # (the first call opens the lane; each place is kept from its second)
            theirs = out[COUNT:] if RANK == 0 else out[:COUNT]
            ready = lane.data[((x.ctypes.data, x.nbytes), (theirs.ctypes.data, theirs.nbytes))]
            assert ready.requests is not None and kept_for.setdefault(step % 2, ready) is ready
    assert len(kept_for) == (2 if N == 2 else 0)


@pytest.mark.parametrize("where", ["in place", "out", "a new result"])
@pytest.mark.parametrize("op,dtype", [("sum", np.float32), ("sum", np.int32), ("avg", np.float32),
                                      ("avg", np.float16), ("max", np.float64)])
@pytest.mark.parametrize("algorithm", [None, "halving", "ring"])
def test_a_two_rank_allreduce_that_halving_carries_keeps_requests_for_its_two_messages_with_the_bits(
        where, op, dtype, algorithm):
    """On two ranks halving (or the ring, the same two messages) sends each rank the half the other
    reduces, then the reduced half back, straight between the arrays: over requests kept for that
    memory from the second call, the contents changing every call (integer values, multiples of the
    world's size for "avg": every way of summing and dividing them is exact, so the bits are those of
    numpy's own reduction of mpi4py's gather)."""
    count = _count(dtype)
    x, given = np.empty(count, dtype), np.empty(count, dtype)
    reduce = {"sum": np.add, "avg": np.add, "max": np.maximum}[op]
    for step in range(6):
        x[...] = _contribution(count, dtype, step) * (N if op == "avg" else 1)   # (avg: a multiple of N, exact)
        every = COMM.allgather(x.copy())
        expected = every[0].copy()
        for other in every[1:]:
            expected = reduce(expected, other)
        if op == "avg":
            expected = (expected / N).astype(dtype)
        out = {"in place": x, "out": given, "a new result": None}[where]
        got = col.allreduce(x, op, out=out, algorithm=algorithm)
        assert got.tobytes() == expected.tobytes()
        if step >= 2 and where != "a new result":
            assert _kept("allreduce", x, out, algorithm, op) == (N == 2)


@pytest.mark.parametrize("layout", ["one way", "mirrored", "each rank its own"])
@pytest.mark.parametrize("algorithm,count", [("halving", 4097), ("ring", 4097), (None, 16385)])
def test_a_call_whose_message_lies_where_another_calls_other_message_lay_has_the_bits_and_writes_only_out(
        layout, algorithm, count):
    """Halving on two ranks of an odd count: its two messages differ in length by one element (each
    rank's half to the other, then the reduced half back). Where a program's arrays put one call's
    second message where another's first lay (x and out slices of one buffer, sharing no element, as
    the API allows), a kept exchange of the other length was reused: a wrong element on one rank, or
    one past ``out`` written, or a call refused as a disagreement (a tester's three layouts). Each
    buffer's address and length key the kept requests: the bits of mpi4py's, nothing outside ``out``."""
    n, h0 = count, (count + 1) // 2   # (h0: the elements of rank 0's half)
    buf, y = np.zeros(4 * n + 1, np.float64), np.empty(n, np.float64)
    mirrored = layout == "mirrored" or layout == "each rank its own" and RANK % 2 == 1
    first_x, first_out = (slice(2 * h0, 2 * h0 + n), slice(0, n)) if mirrored else (slice(0, n), slice(2 * h0, 2 * h0 + n))
    for step in range(4):   # (the first call's exchanges kept)
        buf[first_x] = _contribution(n, np.float64, step)
        expected = COMM.allreduce(buf[first_x].copy())
        assert col.allreduce(buf[first_x], out=buf[first_out], algorithm=algorithm).tobytes() == expected.tobytes()
    out = slice(h0, h0 + n)
    for step in range(4):
        y[...] = _contribution(n, np.float64, step + 10)
        buf[out] = -1.0
        before = buf.copy()
        expected = COMM.allreduce(y)
        assert col.allreduce(y, out=buf[out], algorithm=algorithm).tobytes() == expected.tobytes()
        outside = np.ones(buf.size, bool)
        outside[out] = False
        assert buf[outside].tobytes() == before[outside].tobytes(), "the call wrote outside its out"


def test_new_views_of_the_same_memory_each_call_keep_requests_and_a_result_made_each_call_has_the_bits():
    """A new array object each call over the same memory (as torch's arrays over a tensor) is where the
    last call's data lay: its requests are kept. A result the call makes (no ``out``) lies wherever numpy
    puts it: kept or not, its bits are mpi4py's."""
    base, whole = np.empty(COUNT, np.float32), np.empty(COUNT * N, np.float32)
    for step in range(5):
        base[...] = _contribution(COUNT, np.float32, step)
        assert col.allgather(base).tobytes() == _gathered(base).tobytes()
        x, out = base[:], whole[:]   # (new array objects over the same memory)
        assert col.allgather(x, out=out).tobytes() == _gathered(base).tobytes()
        if step >= 2:
            assert _kept("allgather", x, out) == (N == 2)


@pytest.mark.parametrize("layout", ["transposed", "every other row", "every other element"])
def test_an_allgather_of_x_in_any_layout_after_the_lane_opened_has_the_bits_as_its_contents_change(layout):
    """A lane opened by a contiguous array; then the same array object in another layout, its contents
    changing every call: the result is mpi4py's every time (the rows of such an x are copied to be sent;
    a copy is never mistaken for the array it was made from)."""
    if layout == "every other element":
        x = np.empty(2 * 128 * 128, np.float32)[::2]
    elif layout == "every other row":
        x = np.empty((256, 128), np.float32)[::2]
    else:
        x = np.empty((128, 128), np.float32).T
    out = np.empty((x.shape[0] * N,) + x.shape[1:], np.float32)
    for _ in range(3):   # (a contiguous array of x's shape opens the lane and makes its requests)
        col.allgather(_contribution(x.size, np.float32, 0).reshape(x.shape), out=out)
    for step in range(6):
        x[...] = _contribution(x.size, np.float32, step).reshape(x.shape)
        expected = _gathered(np.ascontiguousarray(x))
        assert col.allgather(x, out=out).tobytes() == expected.tobytes()


@pytest.mark.parametrize("collective", ["broadcast", "allgather"])
def test_kept_requests_hold_no_array_a_program_drops_or_resizes_its_arrays_as_before(collective):
    def call(x, out):
        return col.broadcast(x, 0) if collective == "broadcast" else col.allgather(x, out=out)

    first, first_out = _contribution(COUNT, np.float32, 1), np.empty(COUNT * N, np.float32)
    for _ in range(3):
        call(first, first_out)
    assert _kept(collective, first, 0 if collective == "broadcast" else first_out) == (N == 2)
    first.resize(COUNT + 1, refcheck=True)   # (numpy refuses where anything else refers to the array)
    first_out.resize(COUNT * N + 1, refcheck=True)
    gone = weakref.ref(first), weakref.ref(first_out)
    del first, first_out
    gc.collect()
    assert gone[0]() is None and gone[1]() is None, "the kept requests still hold the arrays"
    second, second_out = _contribution(COUNT, np.float32, 2), np.empty(COUNT * N, np.float32)
    for step in range(3):
        second[...] = _contribution(COUNT, np.float32, step)
        got = call(second, second_out)
        if collective == "broadcast":
            assert got.tobytes() == COMM.bcast(second if RANK == 0 else None, root=0).tobytes()
        else:
            assert got.tobytes() == _gathered(second).tobytes()


@pytest.mark.parametrize("collective", ["broadcast", "allgather"])
def test_a_forced_ring_call_of_8_to_24_kib_goes_whole_and_the_callers_bytes_are_never_framed(collective):
    """The transport cuts its own messages of 8-24 KiB in pieces and writes their count after byte 257
    (``MPITransport.pieces``); a lane's data is the caller's: sent whole, never written, and its
    byte 257 never read as a count, even where it holds one and the transport's mark."""
    count = 16_000   # (bytes a rank: in the range the transport cuts)
    x, out = np.zeros(count, np.uint8), np.empty(count * N, np.uint8)
    for step in range(5):
        x[...] = _contribution(count, np.uint8, step)
        x[257:264] = np.frombuffer(b"\x02pieces", np.uint8)   # (a count and the mark, as the caller's data)
        sent = x.copy()
        if collective == "allgather":
            assert col.allgather(x, out=out, algorithm="ring").tobytes() == _gathered(sent).tobytes()
            assert x.tobytes() == sent.tobytes(), "the transport wrote into the caller's array"
        else:
            expected = COMM.bcast(sent if RANK == 0 else None, root=0)
            assert col.broadcast(x, 0, algorithm="ring").tobytes() == expected.tobytes()
        if step >= 2:
            assert _kept(collective, x, 0 if collective == "broadcast" else out, "ring") == (N == 2)


def test_a_call_that_differs_across_ranks_after_requests_were_kept_is_refused_and_the_next_has_the_bits():
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    x, out = _contribution(COUNT, np.float32, 3), np.empty(COUNT * N, np.float32)
    for _ in range(3):
        col.allgather(x, out=out)
        col.broadcast(x, 0)
    odd = RANK == N - 1
    with pytest.raises(col.CollectiveUsageError, match="allgather: .*differs across ranks"):
        col.allgather(x.astype(np.float64) if odd else x)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: root: root differs across ranks"):
        col.broadcast(x, 1 if odd else 0)
    x[...] = _contribution(COUNT, np.float32, 4)
    assert col.allgather(x, out=out).tobytes() == _gathered(x).tobytes()
    expected = COMM.bcast(x.copy() if RANK == 0 else None, root=0)
    assert col.broadcast(x, 0).tobytes() == expected.tobytes()


def test_kept_requests_that_the_transport_freed_are_made_again_with_the_bits():
    """The transport frees every exchange it keeps at its bound (and at its close): a lane's kept data
    requests among them are made again at its next call."""
    x, out = _contribution(COUNT, np.int32, 5), np.empty(COUNT * N, np.int32)
    for _ in range(3):
        col.allgather(x, out=out)
    col.world_group().transport._free_persistent()
    for step in range(3):
        x[...] = _contribution(COUNT, np.int32, step)
        assert col.allgather(x, out=out).tobytes() == _gathered(x).tobytes()
        assert _kept("allgather", x, out) == (N == 2)


def test_a_loop_over_more_kinds_of_large_call_than_the_ready_exchanges_keeps_its_requests():
    """A loop over 40 kinds of large all-reduce (halving's two messages each on two ranks: 80 kept
    exchanges of the arrays' memory) and 70 sizes of small one (as many ready exchanges, past their
    bound of 64): the lanes' requests are made once, not again at every call, and the bits are right."""
    arrays = [_contribution(COUNT + 64 * k, np.int32, k) for k in range(40)]
    made = {}
    for sweep in range(4):   # (the first opens the lanes, the second is seen, the third makes the requests)
        for k, x in enumerate(arrays):
            expected = COMM.allreduce(x)
            assert col.allreduce(x, out=x).tobytes() == expected.tobytes()
            small = _contribution(k + 1, np.int64, sweep)
            assert col.allreduce(small, timeout=60).tobytes() == COMM.allreduce(small).tobytes()
        if sweep == 2 and N == 2:   # (the last must find the very same)
            made = {k: [ready.requests for ready in _lane("allreduce", x, x).data.values()]
                    for k, x in enumerate(arrays)}
    for k, x in enumerate(arrays):
        if N == 2:
            now = [ready.requests for ready in _lane("allreduce", x, x).data.values()]
            assert len(now) == 2 and all(a is not None and a is b for a, b in zip(now, made[k]))
