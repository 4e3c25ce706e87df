"""Tier 2: the bench's checker (bench/cases.py) in real worlds of 1 to 4 ranks.

Its expected results are derived from a repeating pattern; here they are checked
against the plain reduction of every rank's actual input, gathered from all
ranks, so that #wrong = 0 in the bench means what it says.
"""
import numpy as np
import pytest

import collectives as col
from bench.cases import DTYPES, OPS, REDOPS, Case
from bench.model import _Forced
from collectives.ops import express
from tests.support.in_world import COMM, N, RANK, agree

pytestmark = pytest.mark.mpi

UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def gathered(x: np.ndarray) -> np.ndarray:
    every = np.empty((N, x.size), x.dtype)
    COMM.Allgather(x, every)
    return every


def independent_expectation(case: Case) -> np.ndarray:
    if case.op == "broadcast":
        case.reset()
        return gathered(case.x)[case.root]
    if case.op == "allgather":
        return gathered(case.x).reshape(-1)
    total = UFUNCS[case.redop].reduce(gathered(case.x), axis=0, dtype=case.dtype)
    if case.redop == "avg":
        total = np.true_divide(total, N, dtype=case.dtype)
    if case.op == "reduce_scatter":
        block = case.count // N
        total = total[RANK * block:(RANK + 1) * block]
    return total


CASES = [(op, redop, dtype) for op in OPS for redop in (REDOPS if op in ("allreduce", "reduce_scatter") else ["sum"])
         for dtype in DTYPES if not (redop == "avg" and dtype[0] in "iu")]


@pytest.mark.parametrize("op,redop,dtype", CASES)
def test_expected_result_is_the_reduction_of_every_ranks_input(op, redop, dtype):
    case = Case(COMM, op, dtype, redop, nbytes=1000, root=N - 1)
    expected = independent_expectation(case)
    agree(case.expected.dtype == case.dtype and np.array_equal(case.expected, expected),
          f"{op} {dtype} {redop}: the bench expects something else than the inputs reduce to")
    agree(case.count > 0 and case.nbytes <= 1000, f"{op}: {case.count} elements, {case.nbytes} bytes")
    agree(not np.any(case.expected == case.sentinel), "the sentinel occurs in the expected result")
    if op != "broadcast" and N > 1:
        rows = gathered(case.x)
        agree(not all(np.array_equal(rows[0], row) for row in rows[1:]), "every rank sends the same input")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("impl", ["ring", "mpi"])
@pytest.mark.parametrize("dtype,redop", [("int32", "sum"), ("float16", "avg"), ("int8", "sum"),
                                         ("float32", "prod"), ("uint16", "max")])
def test_correct_calls_count_zero_and_every_damage_counts(op, impl, dtype, redop):
    case = Case(COMM, op, dtype, redop, nbytes=4096, root=0)
    case.reset()
    result = case.run(impl)
    agree(case.wrong(result) == 0, f"{impl} {op}: a correct result was counted wrong")
    result.reshape(-1)[-1] = case.sentinel
    agree(case.wrong(result) == 1, f"{impl} {op}: one changed element was not counted once")
    case.reset()    # a call that writes nothing leaves the sentinel behind: all wrong
    untouched = case.x if op == "broadcast" else case.out
    wrong_if_nothing_written = case.wrong(untouched)
    agree(wrong_if_nothing_written == (0 if op == "broadcast" and RANK == 0 else untouched.size),
          f"{op}: an output the call never wrote was not counted wrong")


@pytest.mark.parametrize("op", col.table.LANED)
@pytest.mark.parametrize("nbytes", [64, 64 << 10, 8 << 20])
def test_the_model_knows_which_forced_calls_ran_in_a_lane(op, nbytes):
    """``bench --model`` fits the calls an express lane carried apart from the others, by a rule of the
    bench's own (it sees only the public API): here the rule against the lanes the runtime kept."""
    group = col.world_group()
    case = _Forced(COMM, op, "float32", "sum", nbytes, 0, group=group)
    for algorithm in case.candidates():
        for _ in range(2):   # (the first call opens the lane where there is one)
            case.reset()
            case.run(algorithm)
        kept = {"allreduce": lambda: express.allreduce_lane(group, case.x, "sum", case.out, algorithm),
                "allgather": lambda: express.allgather_lane(group, case.x, case.out, algorithm),
                "broadcast": lambda: express.broadcast_lane(group, case.x, 0, algorithm)}[op]()
        assert case.in_a_lane(algorithm) == (kept is not None), (algorithm, kept)
