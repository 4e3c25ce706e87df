"""Tier 1: the wire codecs (ring.compression) and the compressed all-reduce simulated in one process.

The simulated ranks run the real algorithms and executor (ring.algorithms, ring.execute) over
in-process transports. Their results are compared bit for bit with :func:`ring_model`, a plain
numpy model of what the compressed ring computes: per chunk, per hop, decode the partial sum,
add this rank's own contribution in the data's dtype, encode once; the owner rounds the
finished chunk through the wire type. And with a float64 reference, within the documented bound.
"""
import numpy as np
import pytest

from ring import algorithms, arrays
from ring.compression import BLOCK, CODECS, bf16_bits, fp16_bits, fp16_to_float32
from ring.partition import chunk_bounds
from tests.support.compression import bound, ring_model, through
from tests.support.simulated import BOUND, simulate, simulate_hosts


pytestmark = pytest.mark.quick

def _ml_dtypes():
    return pytest.importorskip("ml_dtypes")


# The codecs.

@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")   # (ml_dtypes, on the NaNs)
def test_bf16_matches_ml_dtypes_on_every_kind_of_float32():
    """Random bit patterns (every sign, exponent and payload: subnormals, infinities, NaNs), the
    ties exactly halfway, and the values next to the largest finite bfloat16."""
    ml = _ml_dtypes()
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 4096, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    edges = np.array([0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x00000001, 0x80008000,
                      0x7F800001, 0xFF800001, 0xFFFFFFFF, 0x7FC00000], np.uint32)
    x = np.concatenate([bits, ties, edges]).view(np.float32)
    ours = np.empty(x.size, np.uint16)
    CODECS["bf16"].encode(x, ours)
    theirs = x.astype(ml.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(ours[~nan], theirs[~nan])
    decoded = (ours.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(decoded[nan]).all(), "a NaN must stay NaN"
    assert np.array_equal(np.isnan(decoded), nan)


def test_bf16_rounds_to_nearest_even():
    one = 0x3F80   # bfloat16 1.0; its last kept bit is even, 0x3F81's odd
    halfway = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)]          # ties: down to even, up to even, symmetric
    past = [1 + 2**-8 + 2**-20, 1 + 2**-8 - 2**-20]             # just above and below a tie
    out = np.empty(5, np.uint16)
    bf16_bits(np.array(halfway + past, np.float32), out)
    assert out.tolist() == [one, one + 2, 0x8000 | one, one + 1, one]


def test_nan_and_infinities_survive_and_overflow_goes_to_infinity():
    for codec in CODECS.values():
        big = codec.largest * (1 + 2.0 ** -codec.digits)   # past the largest finite wire value, by more than half a unit
        x = np.array([np.nan, -np.nan, np.inf, -np.inf, big, -big, 0.0, -0.0], np.float32)
        assert np.isfinite(x[4]), codec   # (within float32's range: only the wire overflows)
        back = through(codec, x)
        assert np.array_equal(through(codec, np.float32([codec.largest, -codec.largest])),
                              [codec.largest, -codec.largest]), codec
        assert np.isnan(back[:2]).all(), codec
        assert back[2:6].tolist() == [np.inf, -np.inf, np.inf, -np.inf], codec
        assert np.signbit(back[6:]).tolist() == [False, True], codec
    # a NaN whose payload lies only in the low bits would round into the exponent: an infinity
    sneaky = np.array([0x7F800001, 0xFF800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    assert np.isnan(through(CODECS["bf16"], sneaky)).all()


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_every_wire_value_round_trips_exactly(name):
    """Every one of the 65536 wire values decodes and encodes back to itself (NaNs to a NaN), so
    forwarding a decoded chunk re-encodes it exactly, in float32 and in float64."""
    codec = CODECS[name]
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(codec.wire_dtype)
    for dtype in (np.float32, np.float64):
        decoded = np.empty(every.size, dtype)
        codec.decode(every, decoded)
        again = np.empty_like(every)
        codec.encode(decoded, again)
        nan = np.isnan(decoded)
        assert np.array_equal(again.view(np.uint16)[~nan], every.view(np.uint16)[~nan]), dtype
        assert np.isnan(np.asarray(again[nan], np.float32) if name == "fp16" else
                        (again[nan].astype(np.uint32) << 16).view(np.float32)).all()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")   # (numpy's own casts, the reference)
def test_fp16_is_numpys_float16_and_float64_goes_through_the_same_rounding():
    ml = _ml_dtypes()
    rng = np.random.default_rng(2)
    x64 = rng.standard_normal(BLOCK * 2 + 3) * 10.0 ** rng.integers(-6, 6, BLOCK * 2 + 3)   # (several blocks)
    assert np.array_equal(through(CODECS["fp16"], x64), x64.astype(np.float16).astype(np.float64))
    assert np.array_equal(through(CODECS["fp16"], x64.astype(np.float32)),
                          x64.astype(np.float32).astype(np.float16).astype(np.float32))
    expected = x64.astype(np.float32).astype(ml.bfloat16).astype(np.float64)   # float64: via float32, documented
    assert np.array_equal(through(CODECS["bf16"], x64), expected)


def _assert_fp16_encode_is_numpys_cast(x):
    """The fp16 codec's encode of float32 ``x`` against numpy's ``astype(np.float16)``: the same
    bits except on NaNs, which stay NaN, keep their sign and come out quiet (numpy keeps a
    signalling NaN signalling; for a quiet one the bits agree too)."""
    ours = np.empty(x.size, np.float16)
    CODECS["fp16"].encode(x, ours)
    with np.errstate(all="ignore"):
        theirs = x.astype(np.float16)
    ours, theirs, nan = ours.view(np.uint16), theirs.view(np.uint16), np.isnan(x)
    differ = (ours != theirs) & ~nan
    assert not differ.any(), [(hex(b), hex(o), hex(t)) for b, o, t in
                              zip(x.view(np.uint32)[differ][:5], ours[differ][:5], theirs[differ][:5])]
    assert np.array_equal(np.isnan(ours.view(np.float16)), nan)
    assert np.all(ours[nan] & 0x0200), "a NaN must come out quiet"
    assert np.array_equal(ours[nan] >> 15, x.view(np.uint32)[nan] >> 31), "a NaN keeps its sign"
    quiet = nan & (x.view(np.uint32) & 0x00400000 != 0)
    assert np.array_equal(ours[quiet], theirs[quiet])


def test_fp16_encode_is_numpys_cast_for_every_upper_half_and_the_ties():
    """Every float32 upper half (sign, exponent, top 7 significand bits) with low halves that put
    the value exactly halfway between two float16 neighbours, odd and even, in the normal range
    (bit 12) and in the subnormal one (bits 13..15; higher ones come with the upper half), and
    just beside: every kind of float32, every float16 result, overflow and underflow included."""
    lows = [0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001, 0x3000, 0x3FFF, 0x4000,
            0x6000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF]
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    x = np.concatenate([upper | low for low in lows]).view(np.float32)
    _assert_fp16_encode_is_numpys_cast(x)
    # (the cases are there: subnormal and normal ties in both directions, overflow, NaNs)
    with np.errstate(all="ignore"):
        wire = x.astype(np.float16)
    assert np.sum((np.abs(wire) < 2**-14) & (wire != 0)) > 10_000 and np.isinf(wire[np.isfinite(x)]).any()


def test_fp16_encode_is_numpys_cast_on_random_bit_patterns():
    x = np.random.default_rng(4).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    _assert_fp16_encode_is_numpys_cast(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp16_decode_is_numpys_cast_for_every_wire_value(dtype):
    """All 65536 float16 patterns, bit for bit, NaN payloads included (numpy does not quiet a
    signalling NaN, and neither does the decode), in float32 and float64."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ours = np.empty(every.size, dtype)
    CODECS["fp16"].decode(every.view(np.float16), ours)
    theirs = every.view(np.float16).astype(dtype)
    assert ours.tobytes() == theirs.tobytes()
    out = np.empty(4, np.float32)
    assert fp16_to_float32(every[[0x7BFF, 0x8001, 0x7E01, 0]], out) and not fp16_to_float32(every[:3], out[:3])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_fp16_encode_of_float64_is_numpys_cast_unchanged():
    """float64 rounds straight to float16 (numpy's cast, as before): random bit patterns and
    values about float16's subnormal range, where rounding to float32 first would differ on ties."""
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.integers(0, 1 << 63, 1 << 17, dtype=np.uint64).view(np.float64),
                        rng.standard_normal(1 << 17) * 10.0 ** rng.integers(-9, 6, 1 << 17),
                        (rng.integers(0, 1 << 12, 4096) + 0.5) * 2.0 ** -24 * (1 + 2.0 ** -40)])
    ours = np.empty(x.size, np.float16)
    CODECS["fp16"].encode(x, ours)
    theirs = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.array_equal(ours.view(np.uint16)[~nan], theirs.view(np.uint16)[~nan])
    assert np.isnan(ours[nan]).all()


def test_fp16_bits_on_more_than_a_block():
    x = (np.random.default_rng(8).standard_normal(BLOCK * 2 + 5) * 1e-5).astype(np.float32)
    out = np.empty(x.size, np.uint16)
    fp16_bits(x, out)
    assert np.array_equal(out, x.astype(np.float16).view(np.uint16))
    back = np.empty_like(x)
    assert not fp16_to_float32(out, back)
    assert np.array_equal(back, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_round_in_place_is_encode_then_decode(name):
    x = np.random.default_rng(3).standard_normal(BLOCK + 17).astype(np.float32)
    expected = through(CODECS[name], x)
    CODECS[name].round_(x)
    assert np.array_equal(x, expected)
    empty = np.empty(0, np.float32)
    CODECS[name].round_(empty)
    CODECS[name].encode(empty, np.empty(0, CODECS[name].wire_dtype))


# The model of the compressed ring, in one process.


def _inputs(n, count, dtype, scale=100.0, seed=0):
    """Rank-dependent values of mixed signs and magnitudes (1e-3 .. 1e2 times ``scale``/100), not
    integers: rounding to 2 bytes changes most of them."""
    rng = np.random.default_rng([seed, n, count])
    return [(rng.standard_normal(count) * scale * 10.0 ** rng.integers(-5, 1, count) + r).astype(dtype)
            for r in range(n)]


def _compressed(inputs, op, name, segment, in_place, reduce=algorithms.allreduce):
    def body(t):
        x = inputs[t.rank].copy()
        out = x if in_place else np.empty_like(x)
        reduce(t, BOUND, x, out, op, segment, codec=CODECS[name])
        if not in_place:
            assert np.array_equal(x, inputs[t.rank]), "input modified"
        return out
    return simulate(len(inputs), body)


def _same_bits(results):
    assert all(r.tobytes() == results[0].tobytes() for r in results), "ranks differ"


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_the_simulated_compressed_ring_is_the_model_bit_for_bit(n, name, op):
    """Every size class (0 elements, fewer than ranks, uneven chunks, several segments per chunk), in
    place and not, float32 and float64: identical bits on every rank, equal to the model."""
    for count, dtype, in_place in [(0, np.float32, False), (1, np.float32, True), (max(n - 1, 1), np.float64, False),
                                   (n + 1, np.float32, False), (1001, np.float32, True), (517, np.float64, True)]:
        inputs = _inputs(n, count, dtype)
        results = _compressed(inputs, op, name, segment=7, in_place=in_place)
        _same_bits(results)
        expected = ring_model(inputs, op, CODECS[name])
        assert results[0].dtype == dtype
        np.testing.assert_array_equal(results[0], expected, err_msg=f"count {count}, {np.dtype(dtype)}")


def test_the_model_is_not_the_uncompressed_sum():
    """(So that the comparisons above can fail: the rounding shows in most elements.)"""
    inputs = _inputs(4, 1000, np.float32)
    compressed = ring_model(inputs, "sum", CODECS["bf16"])
    assert np.mean(compressed != ring_model(inputs, "sum", None)) > 0.9
    one_rounding = through(CODECS["bf16"], ring_model(inputs, "sum", None))   # rounding the sum once is not it
    assert np.mean(compressed != one_rounding) > 0.2   # (0.28 with these inputs)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_the_error_against_float64_is_within_the_documented_bound(n, name, op):
    inputs = _inputs(n, 3001, np.float32, seed=5)
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0) / (n if op == "avg" else 1)
    result = _compressed(inputs, op, name, segment=256, in_place=False)[0]
    error = np.abs(result - exact)
    limit = bound(inputs, op, CODECS[name], "ring")
    assert np.all(error <= limit), f"worst: {np.max(error / limit):.3f} of the bound"
    assert np.max(error / limit) > 0.01   # (the bound is not vacuous here: the error is seen)


@pytest.mark.parametrize("n", [4, 5])
def test_fp16_avg_does_not_overflow_where_the_average_fits(n):
    """30000 on every rank: the sum (120000 and up) is past float16's 65504, the average is not."""
    inputs = [np.full(9, 30000.0 + r, np.float32) for r in range(n)]
    results = _compressed(inputs, "avg", "fp16", segment=4, in_place=True)
    _same_bits(results)
    assert np.all(np.isfinite(results[0])) and np.allclose(results[0], 30000 + (n - 1) / 2, rtol=2**-10)
    np.testing.assert_array_equal(results[0], ring_model(inputs, "avg", CODECS["fp16"]))
    # the sum does overflow on the wire (documented): so prescaling is what keeps the average finite
    assert np.isinf(_compressed(inputs, "sum", "fp16", segment=4, in_place=False)[0]).all()


def test_fp16_avg_overflows_where_a_first_contribution_travels_alone():
    """docs/api.md's example: -1e5 on rank 0, 1.5e5 on rank 1. Element 0 (rank 0's chunk) starts on
    rank 1, whose 7.5e4 goes on the wire alone: inf. Element 1 starts on rank 0, whose -5e4 travels
    as -49984; rank 1 adds 7.5e4 before sending, and 25016 rounds to 25024 (a tie, to even).
    Recursive doubling (small calls) sends nothing compressed: 25000."""
    inputs = [np.full(2, -1e5, np.float32), np.full(2, 1.5e5, np.float32)]
    for reduce in (algorithms.allreduce, algorithms.allreduce_halving_doubling):
        results = _compressed(inputs, "avg", "fp16", segment=4, in_place=False, reduce=reduce)
        _same_bits(results)
        assert results[0].tolist() == [np.inf, 25024.0], reduce.__name__
    small = simulate(2, lambda t: _small(t, inputs[t.rank], "avg"))
    assert small[0].tolist() == [25000.0, 25000.0]


def _small(t, x, op):
    out = np.empty_like(x)
    assert algorithms.allreduce_small(t, BOUND, x, out, op, b"small")
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_halving_doubling_carries_compression(n, name):
    """Rabenseifner's algorithm adds in another order than the ring (no model here): identical bits
    on every rank, the wire's rounding visible, within its own documented bound."""
    for count in (0, 1, n + 1, 1001):
        inputs = _inputs(n, count, np.float32, seed=7)
        results = _compressed(inputs, "avg", name, segment=64, in_place=count % 2 == 1,
                              reduce=algorithms.allreduce_halving_doubling)
        _same_bits(results)
        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0) / n
        assert np.all(np.abs(results[0] - exact) <= bound(inputs, "avg", CODECS[name], "halving"))
        if count > 100:
            assert np.array_equal(results[0], through(CODECS[name], results[0])), "not rounded to the wire type"


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_two_levels_compress_across_hosts_as_the_model_says(hosts, per_host, op):
    """Within a host the ring adds uncompressed; across hosts each place's chunk takes the
    compressed ring: the model is the uncompressed ring per host, then the compressed ring over the
    hosts' sums for each chunk."""
    n, count, codec = hosts * per_host, 1003, CODECS["bf16"]
    inputs = _inputs(n, count, np.float32, seed=11)

    def body(local, across, rank):
        out = np.empty(count, np.float32)
        algorithms.allreduce_two_level(local, across, BOUND, inputs[rank], out, op, segment_elems=50,
                                       codec=codec)
        return out

    results = simulate_hosts(hosts, per_host, body)
    _same_bits(results)
    per_host_sums = [ring_model(inputs[h * per_host:(h + 1) * per_host], op, None) for h in range(hosts)]
    expected = np.empty(count, np.float32)
    for start, stop in chunk_bounds(count, per_host):
        expected[start:stop] = ring_model([s[start:stop] for s in per_host_sums], op, codec)
    np.testing.assert_array_equal(results[0], expected)


def test_temporary_memory_stays_within_a_few_segments():
    """A compressed call of 200 segments keeps its scratch buffers at one segment each (wire or data)."""
    segment, count = 64, 64 * 200

    def body(t):
        x = np.arange(count, dtype=np.float32) * (t.rank + 1)
        algorithms.allreduce(t, BOUND, x, x, "sum", segment, codec=CODECS["bf16"])
        return {slot: buf.nbytes for slot, buf in arrays._scratch_pools.__dict__.items()}

    for pools in simulate(3, body):
        assert pools and max(pools.values()) <= segment * 4, pools
        assert len(pools) <= 7, pools


def test_uncompressed_calls_are_unchanged():
    """codec=None is the plain ring: the exact sum, not the model's rounding."""
    inputs = _inputs(3, 500, np.float32)
    results = simulate(3, lambda t: _plain(t, inputs[t.rank]))
    np.testing.assert_array_equal(results[0], ring_model(inputs, "sum", None))


def _plain(t, x):
    out = np.empty_like(x)
    algorithms.allreduce(t, BOUND, x, out, "sum", 7)
    return out
