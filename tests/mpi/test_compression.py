"""Tier 2: ``compression=`` on the all-reduce in a real MPI world (tests/test_compression_worlds.py
runs this file under mpiexec -n 1..4, and at 4 ranks on 2 declared hosts).

Every rank computes every rank's input, so each can compute the one-process model of the
compressed ring (tests/test_compression.py's ``ring_model``) and compare bit for bit; every
check is agreed across ranks (``agree``), so a failure on one rank fails all and none hangs.
"""
import numpy as np
import pytest

import collectives as col
from ring.compression import CODECS
from ring.partition import chunk_bounds
from tests.support.compression import bound, errors, ring_model
from tests.support.in_world import N, RANK, agree, same_on_every_rank


pytestmark = pytest.mark.mpi

TINY_SEGMENT_BYTES = 96
BOUND_S = 30   # every call gives up by then: a hang fails instead


@pytest.fixture(autouse=True, params=[None, TINY_SEGMENT_BYTES], ids=["default-segments", "96-byte-segments"])
def segments(request):
    """Default segments, and tiny ones with recursive doubling only up to 1 KiB, so that a few KiB
    take the pipelined, segmented executor; the defaults again after."""
    small = col.settings().small_bytes
    if request.param:
        col.init(segment_bytes=request.param, small_bytes=1024)
    yield request.param
    col.init(segment_bytes=0, small_bytes=small)


def inputs(count, dtype, rank=None, seed=0):
    """Rank ``rank``'s input (all ranks' when None): mixed signs and magnitudes, not integers, so
    that rounding to 2 bytes changes most elements."""
    def one(r):
        rng = np.random.default_rng([seed, r, count])
        return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 2, count) + r).astype(dtype)
    return one(rank) if rank is not None else [one(r) for r in range(N)]


def model(count, dtype, op, name, seed=0):
    """The flat ring's result, computed in this one process."""
    return ring_model(inputs(count, dtype, seed=seed), op, CODECS[name])


def _ring_count(dtype) -> int:
    """Enough elements to take a bandwidth algorithm (above recursive doubling's bytes) and, under
    tiny segments, several segments per rank's chunk, with an uneven remainder."""
    small = col.settings().small_bytes
    return max(small // np.dtype(dtype).itemsize + 1, 8 * N * (TINY_SEGMENT_BYTES // 2)) + 2 * N + 1


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_ring_gives_the_model_bit_for_bit_on_every_rank(name, op, dtype):
    count = _ring_count(dtype)
    x = inputs(count, dtype, RANK)
    before = x.copy()
    result = col.allreduce(x, op, compression=name, algorithm="ring", timeout=BOUND_S)
    agree(np.array_equal(x, before), "input modified")
    agree(same_on_every_rank(result), "ranks differ")
    agree(result.dtype == np.dtype(dtype) and result.tobytes() == model(count, dtype, op, name).tobytes(),
          "not the one-process model")
    inplace = x.copy()
    col.allreduce(inplace, op, out=inplace, compression=name, algorithm="ring", timeout=BOUND_S)
    agree(inplace.tobytes() == result.tobytes(), "in place differs")


@pytest.mark.parametrize("count", [0, 1, N + 1])
def test_few_elements_and_none(count):
    """Fewer elements than ranks, and none: the ring's edge cases, compressed."""
    x = inputs(count, np.float32, RANK)
    result = col.allreduce(x, compression="bf16", algorithm="ring", timeout=BOUND_S)
    agree(same_on_every_rank(result) and result.tobytes() == model(count, np.float32, "sum", "bf16").tobytes(),
          "not the model")


@pytest.mark.parametrize("algorithm", [None, "halving"])
def test_the_runtimes_choice_and_halving_agree_within_the_bound(algorithm):
    """Whatever runs (the cost model's choice, or Rabenseifner's halving and doubling): identical bits
    on every rank, within the documented bound of the float64 sum (the ring's for the runtime's
    choice: the loosest of the compressed algorithms')."""
    count = _ring_count(np.float32) * 3
    every = inputs(count, np.float32)
    result = col.allreduce(every[RANK], "avg", compression="bf16", algorithm=algorithm, timeout=BOUND_S)
    exact = np.sum(np.stack(every).astype(np.float64), axis=0) / N
    agree(same_on_every_rank(result), "ranks differ")
    limit = bound(every, "avg", CODECS["bf16"], algorithm or "ring")
    agree(bool(np.all(np.abs(result - exact) <= limit)), "past the bound")


def tiny_and_mixed(count, dtype, name):
    """Every rank's input for the bound's edges: zeros of both signs, values below the wire's normal
    range (float32's subnormals among them), ties on the wire's subnormal grid, and normal values of
    mixed signs and magnitudes, rank-dependent."""
    codec = CODECS[name]
    normal = 2.0 ** (-126 if name == "bf16" else -14)
    largest = 3e4 / N if name == "fp16" else 1e30   # (no fp16 partial sum may pass 65504)
    every = []
    for r in range(N):
        rng = np.random.default_rng([9, r, count])
        kinds = [np.zeros(count), -np.zeros(count), rng.uniform(-normal, normal, count),
                 rng.integers(-16, 17, count) * codec.tiny, rng.uniform(-1, 1, count) * 2.0 ** -149,
                 rng.uniform(-largest, largest, count) * 10.0 ** -rng.integers(0, 8, count)]
        every.append(np.choose(rng.integers(0, len(kinds), count), kinds).astype(dtype))
    return every


@pytest.mark.parametrize("algorithm", ["ring", "halving", "doubling", "hierarchical"])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_algorithm_keeps_the_documented_bound_below_the_normal_range(algorithm, name, op, dtype):
    """docs/api.md's bound, element by element against the exact sum, on tiny and mixed inputs
    (few enough elements for recursive doubling, which runs them uncompressed)."""
    levels = col.world_group().levels
    if algorithm == "hierarchical" and levels is None:
        pytest.skip("the ranks are not on several hosts (run with COLLECTIVES_HOSTS)")
    hosts = levels[1].size if algorithm == "hierarchical" else 1
    every = tiny_and_mixed(64, dtype, name)
    result = col.allreduce(every[RANK], op, compression=name, algorithm=algorithm, timeout=BOUND_S)
    agree(same_on_every_rank(result), "ranks differ")
    limit = bound(every, op, CODECS[name], algorithm, hosts)
    past = [i for i, (e, most) in enumerate(zip(errors(every, op, result), limit)) if e > most]
    agree(not past, f"past the bound at {past[:5]}")


def test_fp16_avg_overflows_where_a_first_contribution_travels_alone():
    """docs/api.md's example, on 2 ranks: [inf, 25024.] by the ring and by halving, 25000 by the
    runtime's choice for 2 elements (a small call, uncompressed)."""
    if N != 2:
        pytest.skip("the example is on 2 ranks")
    x = np.full(2, [-1e5, 1.5e5][RANK], np.float32)
    for algorithm in ("ring", "halving"):
        result = col.allreduce(x, "avg", compression="fp16", algorithm=algorithm, timeout=BOUND_S)
        agree(result.tolist() == [np.inf, 25024.0], f"{algorithm}: {result}")
    agree(col.allreduce(x, "avg", compression="fp16", timeout=BOUND_S).tolist() == [25000.0, 25000.0], "small call")


def test_small_calls_run_uncompressed_and_exact():
    """Recursive doubling (small calls) moves the data as it is: the uncompressed result, bit for bit."""
    x = inputs(16, np.float32, RANK)
    compressed = col.allreduce(x, compression="fp16", timeout=BOUND_S)
    agree(same_on_every_rank(compressed), "ranks differ")
    agree(compressed.tobytes() == col.allreduce(x, timeout=BOUND_S).tobytes(), "small call was not exact")


def test_noncontiguous_bfloat16_many_and_async():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    count = _ring_count(np.float32)
    expected = model(count, np.float32, "sum", "bf16")
    # a strided view: reduced through one contiguous copy, written back in place
    wide = np.zeros((count, 2), np.float32)
    wide[:, 0] = inputs(count, np.float32, RANK)
    col.allreduce(wide[:, 0], out=wide[:, 0], compression="bf16", algorithm="ring", timeout=BOUND_S)
    agree(wide[:, 0].tobytes() == expected.tobytes() and not wide[:, 1].any(), "strided in place")
    # async: the same bits as the blocking call
    work = col.allreduce(inputs(count, np.float32, RANK), compression="bf16", algorithm="ring", async_op=True,
                         timeout=BOUND_S)
    agree(work.wait().tobytes() == expected.tobytes(), "async differs")
    # allreduce_many fuses the float32 arrays into one buffer: the model of their concatenation
    a, b = inputs(count, np.float32, RANK, seed=1), inputs(7, np.float32, RANK, seed=2).reshape(7, 1)
    col.allreduce_many([a, b], compression="fp16", algorithm="ring", timeout=BOUND_S)
    fused = ring_model([np.concatenate([p, q]) for p, q in zip(inputs(count, np.float32, seed=1),
                                                               inputs(7, np.float32, seed=2))], "sum", CODECS["fp16"])
    agree(np.concatenate([a, b.ravel()]).tobytes() == fused.tobytes(), "allreduce_many differs from the model")
    work = col.allreduce_many([a], op="avg", compression="bf16", async_op=True, timeout=BOUND_S)
    agree(work.wait()[0] is a and same_on_every_rank(a), "async allreduce_many")
    # bfloat16 data is reduced through float32, which travels as bfloat16: rounded once more at the end
    x16 = inputs(count, np.float32, RANK).astype(ml_dtypes.bfloat16)
    result = col.allreduce(x16, compression="bf16", algorithm="ring", timeout=BOUND_S)
    wide_model = ring_model([v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in inputs(count, np.float32)],
                            "sum", CODECS["bf16"]).astype(ml_dtypes.bfloat16)
    agree(result.dtype == x16.dtype and result.tobytes() == wide_model.tobytes(), "bfloat16 data")


def test_two_levels_compress_across_hosts():
    """On declared hosts (COLLECTIVES_HOSTS, consecutive ranks on each): the uncompressed ring within
    each host, the compressed ring across, as tests/test_compression.py's model of two levels."""
    if col.world_group().levels is None:
        pytest.skip("the ranks are not on several hosts (run with COLLECTIVES_HOSTS)")
    local, across = col.world_group().levels
    per_host, hosts = local.size, across.size
    count = _ring_count(np.float32)
    every = inputs(count, np.float32)
    result = col.allreduce(every[RANK], "avg", compression="bf16", timeout=BOUND_S)
    per_host_sums = [ring_model(every[h * per_host:(h + 1) * per_host], "avg", None) for h in range(hosts)]
    expected = np.empty(count, np.float32)
    for start, stop in chunk_bounds(count, per_host):
        expected[start:stop] = ring_model([s[start:stop] for s in per_host_sums], "avg", CODECS["bf16"])
    agree(same_on_every_rank(result), "ranks differ")
    agree(result.tobytes() == expected.tobytes(), "not the model of two levels")


REFUSALS = [   # id, the call, the start of the message every rank raises
    ("unknown name", lambda x: col.allreduce(x, compression="int8"),
     "allreduce: compression: unknown compression 'int8'"),
    ("not a string", lambda x: col.allreduce(x, compression=True), "allreduce: compression: unknown compression"),
    ("integers", lambda x: col.allreduce(x.astype(np.int32), compression="bf16"),
     "allreduce: compression: 'bf16' needs float32, float64 or bfloat16 data, x is int32"),
    ("float16", lambda x: col.allreduce(x.astype(np.float16), compression="fp16"),
     "allreduce: compression: 'fp16' needs float32, float64 or bfloat16 data, x is float16"),
    ("max", lambda x: col.allreduce(x, op="max", compression="bf16"),
     "allreduce: compression: 'bf16' carries 'sum' and 'avg' only, op is 'max'"),
    ("async, prod", lambda x: col.allreduce(x, op="prod", compression="fp16", async_op=True).wait(),
     "allreduce: compression: 'fp16' carries 'sum' and 'avg' only"),
    ("many, an integer array", lambda x: col.allreduce_many([x, np.arange(3)], compression="bf16"),
     "allreduce_many: compression: 'bf16' needs float32, float64 or bfloat16 data, arrays[1] is int64"),
    ("many, unknown name", lambda x: col.allreduce_many([], compression="bf8"),
     "allreduce_many: compression: unknown compression 'bf8'"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refusals_name_the_argument_on_every_rank_and_touch_nothing(case):
    _, call, prefix = case
    x = inputs(_ring_count(np.float32), np.float32, RANK)
    before = x.copy()
    with pytest.raises(col.CollectiveUsageError) as error:
        call(x)
    agree(str(error.value).startswith(prefix), f"message: {error.value}")
    agree(np.array_equal(x, before), "buffer touched")
    agree(np.array_equal(col.allreduce(np.ones(3)), np.full(3, float(N))), "runtime unusable after")


def test_a_refusal_on_one_rank_is_heard_by_every_rank():
    """Only the last rank passes a bad name: every rank raises, naming it."""
    x = inputs(_ring_count(np.float32), np.float32, RANK)
    bad = "nope" if RANK == N - 1 else "bf16"
    with pytest.raises(col.CollectiveUsageError) as error:
        col.allreduce(x, compression=bad, timeout=BOUND_S)
    agree("compression: unknown compression 'nope'" in str(error.value), f"message: {error.value}")


@pytest.mark.parametrize("count", [16, 300_001], ids=["small", "large"])
def test_a_rank_with_another_compression_is_named(count):
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    x = inputs(count, np.float32, RANK)
    before = x.copy()
    mine = None if RANK == N - 1 else "bf16"
    with pytest.raises(col.CollectiveUsageError) as error:
        col.allreduce(x, out=x, compression=mine, timeout=BOUND_S)
    expected = f"allreduce: compression: compression differs across ranks: rank 0: bf16, rank {N - 1}: -"
    agree(str(error.value) == expected, f"message: {error.value}")
    agree(np.array_equal(x, before), "buffer touched")
