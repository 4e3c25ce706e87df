"""The ring's all-reduce of cupy arrays against NCCL's own ``allReduce`` on the same GPU buffers,
as a user's program: ``mpiexec -n N python -m tests.programs.gpu_against_nccl``.

Inputs are random (not integer-valued), so a different order of additions would show. Where the
order is the same as NCCL's (2 ranks: a sum of two terms is the same either way round; min and
max always) the results must be bit-identical. At 1 rank both are a copy (avg: a division by 1),
so bit-identity there shows only that the call path and the dtypes are right. At 3 or more ranks
two correct orders of a sum differ by rounding, which cancellation can make many units in the
last place: a sum (and avg) must then be within (n - 1) machine epsilons of the sum of the inputs'
magnitudes, a product within 2(n - 1) units in the last place. Where NCCL cannot make a
communicator of these ranks (several ranks on one GPU before NCCL 2.30), the reference is every
rank's input reduced in rank order on the host, with the same rules. Prints one line per rank and
exits 1 on any difference.
"""
import sys

import cupy
import numpy as np

import collectives as col

DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
OPS = ["sum", "avg", "min", "max", "prod"]
COUNTS = [1, 3, 1000, 1 << 16, (1 << 22) + 7]


def rank_input(count: int, dtype: str, op: str, rank: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + count)
    if dtype.startswith("float"):
        low, high = (0.5, 1.5) if op == "prod" else (-100.0, 100.0)
        return rng.uniform(low, high, count).astype(dtype)
    high = 3 if op == "prod" else 100
    return rng.integers(0 if dtype.startswith("u") else -high, high, count).astype(dtype)


def same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    return got.tobytes() == expected.tobytes()


def ulps(got: np.ndarray, expected: np.ndarray) -> int:
    """The largest distance in units in the last place (+0 and -0 count as 0 apart)."""
    if got.dtype.kind != "f":
        return 0 if np.array_equal(got, expected) else 1 << 62
    signed = {2: np.int16, 4: np.int32, 8: np.int64}[got.itemsize]
    a, b = got.view(signed).astype(np.int64), expected.view(signed).astype(np.int64)
    # order the bit patterns as the numbers they stand for (negative floats count down)
    top = np.int64(1) << (8 * got.itemsize - 1)
    a, b = np.where(a < 0, -(a + top), a), np.where(b < 0, -(b + top), b)
    return int(np.max(np.abs(a - b))) if a.size else 0


def host_reference(x: np.ndarray, op: str) -> np.ndarray:
    """Every rank's input reduced in rank order in x's own dtype (avg: the sum divided once)."""
    rows = [rank_input(x.size, x.dtype.name, op, r) for r in range(col.size())]
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    total = rows[0].copy()
    for row in rows[1:]:
        ufunc(total, row, out=total)
    return np.true_divide(total, col.size(), dtype=x.dtype) if op == "avg" else total


def within_rounding(got: np.ndarray, expected: np.ndarray, op: str) -> bool:
    """Whether ``got`` may differ from ``expected`` only by the order of a reduction over n > 2 ranks."""
    n = col.size()
    if got.dtype.kind != "f" or op in ("min", "max"):
        return same_bits(got, expected)
    if op == "prod":
        return ulps(got, expected) <= 2 * (n - 1)
    magnitude = sum(np.abs(rank_input(got.size, got.dtype.name, op, r).astype(np.float64)) for r in range(n))
    if op == "avg":
        magnitude = magnitude / n
    bound = (n - 1) * np.finfo(got.dtype).eps * magnitude + np.finfo(got.dtype).smallest_subnormal
    return bool(np.all(np.abs(got.astype(np.float64) - expected.astype(np.float64)) <= bound))


def nccl_reference(comm, x: cupy.ndarray, op: str) -> np.ndarray:
    from cupy.cuda import nccl
    types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
             "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64, "uint8": nccl.NCCL_UINT8}
    ops = {"sum": nccl.NCCL_SUM, "avg": nccl.NCCL_AVG, "prod": nccl.NCCL_PROD, "min": nccl.NCCL_MIN,
           "max": nccl.NCCL_MAX}
    out = cupy.empty_like(x)
    comm.allReduce(x.data.ptr, out.data.ptr, x.size, types[x.dtype.name], ops[op],
                   cupy.cuda.get_current_stream().ptr)
    return cupy.asnumpy(out)


def main() -> int:
    col.use_local_gpu()
    n = col.size()
    try:
        comm, reference = col.nccl_communicator(), "NCCL's allReduce"
    except col.CollectiveError as e:
        comm, reference = None, f"the host, in rank order (no NCCL communicator: {e})"
    problems, identical, checked, worst = [], 0, 0, 0
    for count in COUNTS:
        for dtype in DTYPES:
            for op in OPS:
                if op == "avg" and dtype[0] in "iu":
                    continue
                x = cupy.asarray(rank_input(count, dtype, op, col.rank()))
                got = cupy.asnumpy(col.allreduce(x, op))
                expected = nccl_reference(comm, x, op) if comm is not None else host_reference(cupy.asnumpy(x), op)
                distance = ulps(got, expected)
                checked += 1
                identical += same_bits(got, expected)
                worst = max(worst, distance)
                if not (same_bits(got, expected) if n <= 2 else within_rounding(got, expected, op)):
                    problems.append(f"{op} {dtype} x{count}: {distance} ulp")
    print(f"rank {col.rank()}: {checked} all-reduces over {col.gpu_transport()} against {reference}: "
          f"{identical} bit-identical, worst {worst} ulp, {len(problems)} wrong: {problems[:5]}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
