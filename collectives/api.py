"""The public collectives: validate, pick flat contiguous buffers, run the ring, return.

Any shape and memory layout is accepted: the ring works on the C-order flattening
of the array. Contiguous arrays are used as they are; others go through one
contiguous copy, and the result is written back in the caller's layout.
"""
from __future__ import annotations

import numpy as np

from collectives import validate
from collectives.world import collective, world
from ring import algorithms
from ring.partition import chunk_bounds


def _flat(x: np.ndarray) -> np.ndarray:
    """A flat C-order view of ``x`` when it is contiguous, else a flat copy (which is then ours)."""
    return x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)


def _flat_target(result: np.ndarray) -> np.ndarray:
    """Where to compute ``result``: its own flat view when contiguous, else a new flat buffer."""
    return result.reshape(-1) if result.flags.c_contiguous else np.empty(result.size, result.dtype)


def _write_back(result: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Copy ``flat`` into ``result`` unless it already is ``result``'s own memory (see _flat_target)."""
    if not result.flags.c_contiguous:
        result[...] = flat.reshape(result.shape)
    return result


@collective("allreduce")
def allreduce(x: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``x`` elementwise across all ranks; every rank gets the same bits.

    ``op`` is "sum", "avg", "min", "max" or "prod". ``out=x`` reduces in place;
    without ``out`` a new array is returned and ``x`` is not modified.

    >>> col.allreduce(np.full(3, col.rank() + 1.0))       # on 3 ranks  # doctest: +SKIP
    array([6., 6., 6.])
    """
    validate.reducible("allreduce", "x", x, op)
    if out is not None:
        validate.out_array("allreduce", out, x, x.shape)
    w = world()
    result = out if out is not None else np.empty(x.shape, x.dtype)
    source = _flat(x)
    in_place = out is not None and validate.same_array(out, x)
    target = source if in_place else _flat_target(result)
    algorithms.allreduce(w.transport, source, target, op, w.segment_elems(x.dtype))
    return _write_back(result, target)


@collective("reduce_scatter")
def reduce_scatter(x: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``x`` across ranks; return this rank's block of the flattened result.

    Blocks are split like ``np.array_split(x.ravel(), size())``: with 10 elements
    on 3 ranks, rank 0 gets elements 0-3, rank 1 gets 4-6, rank 2 gets 7-9.

    >>> col.reduce_scatter(np.arange(10.0))               # rank 1 of 3  # doctest: +SKIP
    array([12., 15., 18.])
    """
    validate.reducible("reduce_scatter", "x", x, op)
    w = world()
    owned_start, owned_stop = chunk_bounds(x.size, w.size)[w.rank]
    if out is not None:
        validate.out_array("reduce_scatter", out, x, (owned_stop - owned_start,))
    source = _flat(x)
    work = np.empty(x.size, x.dtype) if x.flags.c_contiguous else source   # a copy of x is ours to reuse
    owned = algorithms.reduce_scatter(w.transport, source, work, op, w.segment_elems(x.dtype))
    result = out if out is not None else np.empty(owned_stop - owned_start, x.dtype)
    result[...] = work[owned]
    return result


@collective("allgather")
def allgather(x: np.ndarray) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0, in rank order; axis 0 may differ between ranks.

    >>> col.allgather(np.full((col.rank() + 1, 2), col.rank()))   # on 2 ranks  # doctest: +SKIP
    array([[0, 0],
           [1, 1],
           [1, 1]])
    """
    validate.array("allgather", "x", x)
    if x.ndim == 0:
        validate.fail("allgather", "x", "is 0-dimensional; allgather concatenates along axis 0")
    w = world()
    lengths = _agreed_lengths(w, x)
    result = np.empty((int(lengths.sum()),) + x.shape[1:], x.dtype)
    row = int(np.prod(x.shape[1:], dtype=np.int64))
    algorithms.allgather(w.transport, _flat(x), result.reshape(-1), [int(n) * row for n in lengths],
                         w.segment_elems(x.dtype))
    return result


_MAX_DIMS, _MAX_DTYPE_CHARS = 64, 16


def _agreed_lengths(w, x: np.ndarray) -> np.ndarray:
    """Every rank's axis-0 length, once dtype and trailing shape are known to agree everywhere."""
    dtype_code = [ord(c) for c in x.dtype.str][:_MAX_DTYPE_CHARS]
    header = np.zeros(1 + _MAX_DIMS + _MAX_DTYPE_CHARS, dtype=np.int64)
    header[0] = x.ndim
    header[1: 1 + x.ndim] = x.shape
    header[1 + _MAX_DIMS: 1 + _MAX_DIMS + len(dtype_code)] = dtype_code
    every = w.transport.allgather_ints(header)
    dtypes = [np.dtype("".join(chr(c) for c in row[1 + _MAX_DIMS:] if c)) for row in every]
    trailing = [tuple(int(d) for d in row[2: 1 + row[0]]) for row in every]
    for what, values in (("dtype", dtypes), ("trailing shape", trailing)):
        if any(v != values[0] for v in values):
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            validate.fail("allgather", "x", f"{what} differs across ranks: {listing}")
    return every[:, 1]


@collective("broadcast")
def broadcast(x: np.ndarray, root: int = 0) -> np.ndarray:
    """Overwrite ``x`` on every rank with ``root``'s ``x``, in place; returns ``x``.

    A pipelined chain along the ring: large buffers move at nearly one link's
    bandwidth whatever the number of ranks.

    >>> params = col.broadcast(params, root=0)                         # doctest: +SKIP
    """
    validate.array("broadcast", "x", x)
    w = world()
    validate.root("broadcast", root, w.size)
    if w.rank != root:
        validate.writable("broadcast", "x", x)
    buffer = _flat(x) if w.rank == root else _flat_target(x)
    algorithms.broadcast(w.transport, buffer, int(root), w.segment_elems(x.dtype))
    return _write_back(x, buffer) if w.rank != root else x


@collective("barrier")
def barrier() -> None:
    """Return once every rank has entered the barrier."""
    w = world()
    w.transport.barrier()
