"""What the tests that run inside a world (tests/mpi, every rank running pytest) share: the world,
a check agreed by every rank, rank-dependent inputs and MPI's own results as the reference.
Importing this starts MPI."""
import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives.calls.config import DEFAULT_SEGMENT_BYTES

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def agree(ok: bool, message: str) -> None:
    """Assert on every rank at once: each rank learns which ranks failed."""
    failed = [r for r, good in enumerate(COMM.allgather(bool(ok))) if not good]
    assert not failed, f"{message} (failed on ranks {failed})"


def rank_input(count, dtype, op, rank=RANK):
    """Integer-valued, rank-dependent, exactly reducible in every dtype (never all ones)."""
    i = np.arange(count)
    values = (i * 7 + rank * 13) % 11 + 1 if op != "prod" else (i + rank) % 3 + 1
    if np.dtype(dtype).kind in "if" and op in ("min", "max"):
        values = values - 5   # negatives too, where the dtype has them
    return values.astype(dtype)


def mpi_reference(x, op):
    """The MPI library's own result for ``op`` ("avg": its sum, divided by n in x's dtype)."""
    expected = np.empty_like(x)
    COMM.Allreduce(x, expected, op=MPI_OPS[op])
    if op == "avg":
        expected = (expected / N).astype(x.dtype)
    return expected


def same_on_every_rank(result) -> bool:
    everyone = COMM.allgather(np.ascontiguousarray(result).tobytes())
    return all(b == everyone[0] for b in everyone)


TINY_SEGMENT_BYTES, TINY_SMALL_BYTES = 96, 1024


@pytest.fixture(autouse=True, params=[None, TINY_SEGMENT_BYTES], ids=["default-segments", "96-byte-segments"])
def segment_size(request):
    """Default segments (lockstep for these sizes) and tiny ones (the pipelined executor), the
    latter with recursive doubling only up to 1 KiB, so that a few KiB already take the segmented
    ring (see :func:`pipelined`); the defaults again after (the next module's calls must not crawl
    in 96-byte messages)."""
    small = col.settings().small_bytes
    if request.param:
        col.init(segment_bytes=request.param, small_bytes=TINY_SMALL_BYTES)
    yield request.param or DEFAULT_SEGMENT_BYTES
    col.init(segment_bytes=0, small_bytes=small)


def pipelined(count: int, dtype, segment_size: int) -> int:
    """``count`` elements, or under tiny segments as many as give each rank's block 8 of them (the
    pipeline's start, steady state and end) and an odd remainder: the ring's path at a tenth of the
    messages (200 003 elements of 96-byte segments took 12 s of a world's 73 at n=4)."""
    return min(count, 8 * N * (segment_size // np.dtype(dtype).itemsize) + 5)
