"""The body of ``allreduce(x, reproducible=True)``: the exact sum of every contribution, rounded once.

The codec is ``ring.reproducible``; this module checks the arguments and runs its steps on the
group's all-reduces (``collectives.ops.bodies.allreduce_flat``). On one or two ranks, float32 or
float64, each rank first sends an outline of its data (its largest magnitude, its count of
contributions, whether any value is NaN or infinite). Where it shows two contributions in all,
or one, nothing else is needed (``codec.one_rounding``): the plain all-reduce adds them, and one
IEEE addition is their exact sum rounded once (DDP's hook on two ranks, one contribution each).
Otherwise:

1. every rank's facts (one row of a small int64 matrix, the others zero) summed: every rank then
   holds every row, and makes the same grid (the call's first exchange, outline or facts,
   carries the cross-rank check);
2. only where some rank holds a NaN, an infinity or -0.0: each element's marks, by "max";
3. the contributions as words on the grid (int64, or a float where the grid's sums fit its
   significand), summed. Sums on the grid are exact whatever the algorithm, the segments or the
   order, so the total is the same on every rank and at any world size; it is rounded once,
   into the result. Past recursive doubling's sizes the ring runs in two halves with the
   rounding between them (:func:`_split`): each rank rounds its own chunk, and the rounded
   chunks travel in the data's dtype.

``x`` is one array, or a list of same-shape arrays that this rank holds (each counted as if
another rank held it). "avg" divides by the number of contributions of every rank together.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from collectives.calls import validate
from collectives.calls.call import Call
from collectives.ops.bodies import allreduce_flat, choose, flat, flat_target, transport_for, write_back
from ring import algorithms, arrays, reproducible as codec

#: The scratch slot (``ring.arrays.scratch``) of the words, past the executor's own.
_TOTAL = 8
#: Diagnostic (``scripts/reproducible_cost.py``, through :func:`record_stages`): where a dict,
#: every call adds the seconds of each of its stages ("facts", "grid", "marks", "encode", "wire",
#: "decode") into it.
stage_seconds: dict | None = None


def record_stages(into: dict | None) -> None:
    """From now on every call adds its stages' seconds into ``into`` (None: no more).

    >>> seconds = {}; record_stages(seconds)   # ... calls ...; then seconds["encode"] and the others
    >>> record_stages(None)
    """
    global stage_seconds
    stage_seconds = into


class _Stages:
    """Adds the seconds since the last stage into ``stage_seconds`` under each stage's name.

    >>> seconds = {}; clock = _Stages(seconds); clock("facts"); sorted(seconds)
    ['facts']
    """

    def __init__(self, into: dict | None):
        self.into, self.last = into, time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.into[stage] = self.into.get(stage, 0.0) + now - self.last
            self.last = now


def allreduce(call: Call, x: Any, op: Any, out: Any, compression: Any = None, reproducible: Any = True) -> Any:
    """``x`` (an array, or a list of same-shape arrays) summed over every rank's contributions,
    exactly, rounded once to x's dtype ("avg": divided by their count first); see the module."""
    if reproducible is not True:
        validate.fail(call.name, "reproducible", f"expected True or False, got {reproducible!r}")
    parts, out, in_place = contributions(call.name, x, op, out, compression)
    first = parts[0]
    sig = call.signature(op, first.dtype, first.shape, memory="host", reproducible=True)
    call.nbytes = first.nbytes
    transport = call.group.transport
    clock = _Stages(stage_seconds)
    result = out if out is not None else np.empty(first.shape, first.dtype)
    outlined = codec.outline_first(transport.size, first.dtype, len(parts))   # (elsewhere one rounding cannot hold)
    if outlined:
        every = _everyones(call, codec.outline(parts), sig, clock, checked=False)
        if codec.one_rounding(every, first.dtype, op):
            result = _added_once(call, parts, op, sig, result, in_place)
            clock("wire")
            return result
    cast = _cast_scratch(parts, transport.size)
    every = _everyones(call, codec.facts(parts, cast), sig, clock, checked=outlined)
    target = flat_target(result)
    flats = [p.reshape(-1) for p in parts]
    grid = codec.grid(every, first.dtype)
    special = None
    if grid.marked:
        special = np.zeros((2, first.size), np.uint8)
        codec.marks(parts, special)
        _sum_in_place(call, special, "max", sig)
        clock("marks")
    encoded = cast is not None and grid.wire_dtype == np.float64 and grid.words == 1   # (by the facts, in _TOTAL)
    algorithm = choose(call, "allreduce", grid.words * first.size * grid.wire_dtype.itemsize, True)
    if algorithm != "doubling" and call.forced in (None, "ring") and first.size >= transport.size:
        call.algorithm = "ring"
        _split(call, flats, grid, special, op, target, clock, encoded)
    else:
        total = arrays.scratch(first, grid.words * first.size, _TOTAL, grid.wire_dtype).reshape(grid.words, -1)
        if not encoded:
            codec.encode(flats, grid, total)
        clock("encode")
        _sum_in_place(call, total, "sum", sig)
        clock("wire")
        codec.decode(total, grid, special, op, target)
        clock("decode")
    return write_back(result, target)


def _cast_scratch(parts: list, ranks: int) -> np.ndarray | None:
    """Where the facts cast x to a float64 wire as they read it (for one read of x): one float32
    contribution, whose grid is a float64 wire but for a wide span (a large model's gradients)."""
    if len(parts) != 1 or parts[0].dtype != np.float32:
        return None
    return arrays.scratch(parts[0], -(-parts[0].size // ranks) * ranks, _TOTAL, np.dtype(np.float64))


def _everyones(call: Call, row: np.ndarray, sig: bytes, clock: _Stages, checked: bool) -> np.ndarray:
    """Every rank's ``row`` of facts (``codec.facts`` or ``codec.outline``), by one small all-reduce."""
    clock("facts")
    every = np.zeros((call.group.transport.size, codec.FACTS), np.int64)
    every[call.group.transport.rank] = row
    _sum_in_place(call, every, "sum", sig, checked)
    clock("grid")
    return every


def _added_once(call: Call, parts: list, op: str, sig: bytes, result: np.ndarray, in_place: bool) -> np.ndarray:
    """``result`` = the plain all-reduce of ``parts``, where it gives the exact sum rounded once
    (``codec.one_rounding``): one contribution on each of two ranks, or one or two on a single
    rank (added here); as the plain call runs it, in place where ``result`` is ``parts[0]``."""
    if len(parts) == 2:
        target = flat_target(result)
        source = np.add(parts[0].reshape(-1), parts[1].reshape(-1), out=target)
        if op == "avg":
            target /= 2
    else:
        source = flat(parts[0])
        target = source if in_place else flat_target(result)
    allreduce_flat(call, source, target, op, sig, True, checked=True)
    return write_back(result, target)


def _split(call: Call, flats: list, grid: codec.Grid, special: np.ndarray | None, op: str, target: np.ndarray,
           clock: _Stages, encoded: bool) -> None:
    """The ring's all-reduce with the decoding between its halves: the words are reduced and
    scattered, each rank rounds its own chunk of the exact total, and the rounded chunks (the
    data's dtype, narrower than the words) go round to every rank. So each rank decodes 1/n of
    the elements, and the all-gather carries the data's bytes, not the words'. The chunks are
    ``per`` elements each (the last ones padded with zeros), each laid out as its words, so that
    the reduce-scatter's equal chunks of the words are the ranks' chunks of the elements
    (``encoded``: one word, there already, but for the padding)."""
    transport = transport_for(call, target)
    n, me, size = transport.size, transport.rank, target.size
    per = -(-size // n)
    ranges = [(min(k * per, size), min((k + 1) * per, size)) for k in range(n)]
    total = arrays.scratch(target, n * grid.words * per, _TOTAL, grid.wire_dtype)
    chunks = total.reshape(n, grid.words, per)
    for k, (start, stop) in enumerate(ranges):
        if stop > start and not encoded:
            codec.encode([f[start:stop] for f in flats], grid, chunks[k, :, :stop - start])
        chunks[k, :, stop - start:] = 0
    clock("encode")
    algorithms.reduce_scatter(transport, call, total, total, "sum", call.runtime.segment_elems(grid.wire_dtype, transport))
    clock("wire")
    start, stop = ranges[me]
    codec.decode(chunks[me, :, :stop - start], grid, None if special is None else special[:, start:stop], op,
                 target[start:stop])
    clock("decode")
    algorithms.allgather(transport, call, arrays.transportable(target[start:stop]), arrays.transportable(target),
                         [b - a for a, b in ranges], call.runtime.segment_elems(target.dtype, transport))
    clock("wire")


def _sum_in_place(call: Call, x: np.ndarray, op: str, sig: bytes, checked: bool = True) -> None:
    flat = x.reshape(-1)   # (one view, passed twice: the executor knows in place by identity)
    allreduce_flat(call, flat, flat, op, sig, True, checked)


def contributions(collective: str, x: Any, op: Any, out: Any, compression: Any) -> tuple[list, Any, bool]:
    """``x`` as a list of host arrays of one floating dtype and shape, ``out``, and whether ``out``
    is x[0]'s own memory (in place), checked for a reproducible all-reduce by ``op``; anything else
    is a usage error that names the argument.

    >>> contributions("allreduce", [np.zeros(2), np.zeros(3)], "sum", None, None)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    collectives.errors.CollectiveUsageError: allreduce: x[1]: shape (3,) differs from x[0]'s (2,) (...)
    """
    if compression is not None:
        validate.fail(collective, "compression", "reproducible=True moves exact integers; pass compression=None")
    if op not in ("sum", "avg"):
        validate.fail(collective, "op", f"reproducible=True sums ('sum' or 'avg'), op is {op!r} "
                                        "('min' and 'max' give the same bits at any world size already)")
    listed = isinstance(x, (list, tuple))
    if listed and not x:
        validate.fail(collective, "x", "is an empty list; pass at least one contribution")
    parts = [validate.plain(collective, f"x[{i}]" if listed else "x", a) for i, a in enumerate(x if listed else [x])]
    for i, a in enumerate(parts):
        _floating(collective, f"x[{i}]" if listed else "x", a)
        if a.shape != parts[0].shape or a.dtype != parts[0].dtype:
            what = "shape" if a.shape != parts[0].shape else "dtype"
            validate.fail(collective, f"x[{i}]", f"{what} {getattr(a, what)} differs from x[0]'s "
                                                 f"{getattr(parts[0], what)} (summed element by element)")
    in_place = False
    if out is not None:
        out = validate.plain(collective, "out", out)
        in_place = validate.out_array(collective, out, parts[0], parts[0].shape)
    return parts, out, in_place


def _floating(collective: str, argument: str, a: Any) -> None:
    validate.array(collective, argument, a)
    if not isinstance(a, np.ndarray):
        validate.fail(collective, argument, "reproducible=True is not implemented for GPU (cupy) arrays")
    if not a.dtype.isnative:   # (the codec reads the bits as this machine's integers)
        validate.fail(collective, argument, f"dtype {a.dtype.str} is not in this machine's byte order; pass "
                                            f"{argument}.astype({a.dtype.name!r})")
    if a.dtype.name not in codec.PRECISION:
        why = "integer sums are exact and reproducible already: pass reproducible=False" if a.dtype.kind in "iub" \
            else "expected float16, bfloat16, float32 or float64"
        validate.fail(collective, argument, f"reproducible=True sums floating-point data, {argument} is "
                                            f"{a.dtype} ({why})")
