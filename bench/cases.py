"""One collective at one size, as the bench runs it: the buffers, the exact expected
result, and the call of each implementation on those same buffers.

Sizes follow nccl-tests: ``nbytes`` is the whole buffer of the collective (the
all-reduce and broadcast buffer, reduce-scatter's input, all-gather's output),
rounded down so that reduce-scatter and all-gather split it evenly, and
``count`` is its number of elements.

Inputs are small integers that depend on the rank and repeat with period 8, so
every result is exact in every dtype and known in advance (integer overflow
wraps identically everywhere). For example, the sum on 2 ranks:

    element        0  1  2  3  4  5  6  7 | 8 ...
    rank 0 sends   0  1  2  3  4  0  1  2 | 0 ...     (j + rank) % 5
    rank 1 sends   1  2  3  4  0  1  2  3 | 1 ...
    expected       1  3  5  7  4  1  3  5 | 1 ...

Before every call the output is filled with a sentinel that the result can
never contain, so a call that writes nothing (or too little) shows as wrong.

With ``xp=cupy`` the buffers live on this rank's GPU; the implementations are
then ours (``ring``) and NCCL's own collectives (``nccl``). With ``gloo`` (a
``bench.gloo.Gloo``) torch's gloo runs on torch views of the same host buffers.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import collectives as col

#: The collectives the bench times: those whose algorithm the runtime chooses by size (the table's).
OPS = col.table.SIZED
#: Those of them that reduce, for which --redop means something.
REDUCING = tuple(op for op in OPS if col.table.BY_NAME[op].reduces)
REDOPS = ("sum", "avg", "min", "max", "prod")
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64")
#: Our all-reduce with ``compression=``, one column per codec (see IMPLEMENTATIONS): "ring-bf16", ...
COMPRESSED = tuple(f"ring-{codec}" for codec in col.table.CODECS)
PERIOD = 8


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks, as nccl-tests defines it (what each link carries)."""
    if op == "broadcast":
        return 1.0
    share = (n - 1) / n
    return 2 * share if op == "allreduce" else share


def _contribution(op: str, redop: str, rank: int, n: int) -> np.ndarray:
    """What ``rank`` puts in at positions 0..PERIOD-1 (the pattern repeats)."""
    j = np.arange(PERIOD)
    if op not in REDUCING:
        return (j + 3 * rank) % 11
    if redop == "prod":
        return 1 + (j + rank) % 2             # products are powers of two: exact until they overflow
    if redop in ("min", "max"):
        return (3 * j + 5 * rank) % 7
    if redop == "avg":
        return n * ((j + rank) % 5)           # each share divides by n exactly
    return (j + rank) % 5


def _reduced(redop: str, rows: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """The exact reduction of ``rows`` (one per rank) in ``dtype``'s own arithmetic."""
    if redop == "avg":
        return np.true_divide(np.add.reduce(rows, axis=0, dtype=dtype), n, dtype=dtype)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[redop]
    return ufunc.reduce(rows, axis=0, dtype=dtype)


def _tiled(period: np.ndarray, start: int, length: int) -> np.ndarray:
    """Elements ``start .. start+length`` of ``period`` repeated forever."""
    return np.resize(np.roll(period, -(start % PERIOD)), length)


def _sentinel(dtype: np.dtype, values: np.ndarray):
    """A value of ``dtype`` that no element of the result can equal."""
    if dtype.kind == "f":
        return np.nan
    info = np.iinfo(dtype)
    return next(v for v in range(info.max, info.min - 1, -1) if not np.any(values == v))


class Case:
    """Collective ``op`` of ``nbytes`` on this rank: ``run(impl)`` calls it, ``wrong(result)`` checks it.

    >>> case = Case(comm, "allreduce", "float32", "sum", 4096)     # doctest: +SKIP
    >>> case.reset(); case.wrong(case.run("ring"))                  # doctest: +SKIP
    0
    """

    def __init__(self, comm: MPI.Comm, op: str, dtype: str, redop: str, nbytes: int, root: int = 0,
                 xp: ModuleType = np, nccl_comm: Any = None, group: col.Group | None = None, gloo: Any = None):
        self.comm, self.op, self.redop, self.root = comm, op, redop, root
        self.group = group   # where the ring runs (None: the world), the same ranks as ``comm``
        self.algorithm: str | None = None   # the one the ring's calls force (None: the runtime's choice)
        self.xp, self.nccl_comm = xp, nccl_comm
        self.on_device = xp is not np
        self.dtype = np.dtype(dtype)
        n, rank = comm.Get_size(), comm.Get_rank()
        self.n = n
        count = nbytes // self.dtype.itemsize
        if col.table.BY_NAME[op].blocks:   # (one block per rank: split evenly)
            count -= count % n
        self.count, self.nbytes = count, count * self.dtype.itemsize
        rows = np.array([_contribution(op, redop, r, n) for r in range(n)]).astype(self.dtype)
        block = count // n
        if op == "allgather":
            self.x = _tiled(rows[rank], 0, block)
            self.expected = np.concatenate([_tiled(rows[r], 0, block) for r in range(n)])
            period = rows
        elif op == "broadcast":
            self.expected = _tiled(rows[root], 0, count)
            self.x = np.empty_like(self.expected)
            period = rows[root]
        else:
            period = _reduced(redop, rows, n, self.dtype)
            self.x = _tiled(rows[rank], 0, count)
            start, length = (rank * block, block) if op == "reduce_scatter" else (0, count)
            self.expected = _tiled(period, start, length)
        self.sentinel = _sentinel(self.dtype, period)
        if self.on_device:
            self.x, self.expected = xp.asarray(self.x), xp.asarray(self.expected)
        self.out = xp.empty_like(self.expected)
        self.gloo = gloo   # torch's gloo group (None: not timed), and its views of the buffers
        self.tx, self.tout = (gloo.tensor(self.x), gloo.tensor(self.out)) if gloo else (None, None)

    def reset(self, impl: str | None = None) -> None:
        """Before each call: the output holds the sentinel (broadcast: the root's buffer its data).
        Before gloo's all-reduce, which works in place, the output holds the input instead."""
        if impl == "gloo" and self.op == "allreduce":
            self.xp.copyto(self.out, self.x)
        elif self.op == "broadcast" and self.comm.Get_rank() == self.root:
            self.xp.copyto(self.x, self.expected)
        elif self.op == "broadcast":
            self.x.fill(self.sentinel)
        else:
            self.out.fill(self.sentinel)

    def run(self, impl: str) -> np.ndarray:
        """One call of ``impl`` ("ring", "mpi", "gloo" or "nccl"); returns the array that holds this rank's result."""
        return IMPLEMENTATIONS[impl][self.op](self)

    def wrong(self, result: np.ndarray) -> int:
        """How many elements of ``result`` differ from the exact answer (or its size, if it has the wrong shape)."""
        if result.shape != self.expected.shape:
            return max(result.size, self.expected.size)
        return int(self.xp.count_nonzero(result != self.expected))

    def synchronize(self) -> None:
        """Wait until the work queued on this rank's GPU is done (what the timings include)."""
        col.synchronize(self.expected)


def _ring_allreduce(c: Case) -> np.ndarray:
    return col.allreduce(c.x, c.redop, out=c.out, group=c.group, algorithm=c.algorithm)


def _ring_allreduce_compressed(codec: str) -> Callable[[Case], np.ndarray]:
    """Our all-reduce with ``compression=codec``: the inputs are small integers, whose sums a
    2-byte float holds exactly (bfloat16 up to 256), so its results are checked exactly too."""
    def allreduce(c: Case) -> np.ndarray:
        return col.allreduce(c.x, c.redop, out=c.out, group=c.group, algorithm=c.algorithm, compression=codec)
    return allreduce


def _ring_reduce_scatter(c: Case) -> np.ndarray:
    return col.reduce_scatter(c.x, c.redop, out=c.out, group=c.group, algorithm=c.algorithm)


def _ring_allgather(c: Case) -> np.ndarray:
    return col.allgather(c.x, out=c.out, group=c.group, algorithm=c.algorithm)


def _ring_broadcast(c: Case) -> np.ndarray:
    return col.broadcast(c.x, root=c.root, group=c.group, algorithm=c.algorithm)


_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def _average(c: Case) -> None:
    """MPI and gloo have no average: their "avg" is a sum, then one division (timed as part of the call)."""
    if c.redop == "avg":
        np.true_divide(c.out, c.n, out=c.out)


def _mpi_allreduce(c: Case) -> np.ndarray:
    c.comm.Allreduce(c.x, c.out, op=_MPI_OPS[c.redop])
    _average(c)
    return c.out


def _mpi_reduce_scatter(c: Case) -> np.ndarray:
    c.comm.Reduce_scatter_block(c.x, c.out, op=_MPI_OPS[c.redop])
    _average(c)
    return c.out


def _mpi_allgather(c: Case) -> np.ndarray:
    c.comm.Allgather(c.x, c.out)
    return c.out


def _mpi_broadcast(c: Case) -> np.ndarray:
    c.comm.Bcast(c.x, root=c.root)
    return c.x


def _nccl_type(c: Case) -> int:
    from cupy.cuda import nccl
    return getattr(nccl, _NCCL_TYPES[c.dtype.name])


def _nccl_op(c: Case) -> int:
    from cupy.cuda import nccl
    return getattr(nccl, _NCCL_OPS[c.redop])


def _stream(c: Case) -> int:
    return c.xp.cuda.get_current_stream().ptr


_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
               "int64": "NCCL_INT64", "uint64": "NCCL_UINT64"}    # NCCL has no 16-bit integers
_NCCL_OPS = {"sum": "NCCL_SUM", "avg": "NCCL_AVG", "min": "NCCL_MIN", "max": "NCCL_MAX", "prod": "NCCL_PROD"}


def _nccl_allreduce(c: Case) -> Any:
    c.nccl_comm.allReduce(c.x.data.ptr, c.out.data.ptr, c.x.size, _nccl_type(c), _nccl_op(c), _stream(c))
    return c.out


def _nccl_reduce_scatter(c: Case) -> Any:
    c.nccl_comm.reduceScatter(c.x.data.ptr, c.out.data.ptr, c.out.size, _nccl_type(c), _nccl_op(c), _stream(c))
    return c.out


def _nccl_allgather(c: Case) -> Any:
    c.nccl_comm.allGather(c.x.data.ptr, c.out.data.ptr, c.x.size, _nccl_type(c), _stream(c))
    return c.out


def _nccl_broadcast(c: Case) -> Any:
    c.nccl_comm.broadcast(c.x.data.ptr, c.x.data.ptr, c.x.size, _nccl_type(c), c.root, _stream(c))
    return c.x


def nccl_supports(dtype: str) -> bool:
    return dtype in _NCCL_TYPES


def _gloo_allreduce(c: Case) -> np.ndarray:
    """gloo's all-reduce of ``c.out``, which holds the input (``Case.reset`` put it there)."""
    c.gloo.all_reduce(c.tout, op=c.gloo.ops[c.redop])
    _average(c)
    return c.out


def _gloo_reduce_scatter(c: Case) -> np.ndarray:
    """gloo's reduce-scatter of ``c.x`` into ``c.out``."""
    c.gloo.reduce_scatter(c.tout, c.tx, op=c.gloo.ops[c.redop])
    _average(c)
    return c.out


def _gloo_allgather(c: Case) -> np.ndarray:
    """gloo's all-gather of ``c.x`` into ``c.out``."""
    c.gloo.all_gather(c.tout, c.tx)
    return c.out


def _gloo_broadcast(c: Case) -> np.ndarray:
    """gloo's broadcast of ``c.x`` from ``c.root``, in place."""
    c.gloo.broadcast(c.tx, src=c.root)
    return c.x


IMPLEMENTATIONS: dict[str, dict[str, Callable[[Case], Any]]] = {
    "ring": {"allreduce": _ring_allreduce, "reduce_scatter": _ring_reduce_scatter,
             "allgather": _ring_allgather, "broadcast": _ring_broadcast},
    **{f"ring-{codec}": {"allreduce": _ring_allreduce_compressed(codec)}   # (compression=: the all-reduce only)
       for codec in col.table.CODECS},
    "mpi": {"allreduce": _mpi_allreduce, "reduce_scatter": _mpi_reduce_scatter,
            "allgather": _mpi_allgather, "broadcast": _mpi_broadcast},
    "gloo": {"allreduce": _gloo_allreduce, "reduce_scatter": _gloo_reduce_scatter,
             "allgather": _gloo_allgather, "broadcast": _gloo_broadcast},
    "nccl": {"allreduce": _nccl_allreduce, "reduce_scatter": _nccl_reduce_scatter,
             "allgather": _nccl_allgather, "broadcast": _nccl_broadcast},
}
