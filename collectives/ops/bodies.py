"""The body of each data collective, once its call has begun (``collectives.calls.call``): check the
arguments, settle once what the call holds (host or GPU array, flat contiguous view, where the
result goes), choose the algorithm, run it (``ring.algorithms``), write the result back.

Any shape and memory layout is accepted: the ring works on the C-order flattening of the
array. Contiguous arrays are used as they are; others go through one contiguous copy, and the
result is written back in the caller's layout. A numpy subclass (``np.matrix``) is used through
a plain ndarray view, and results are plain arrays; masked arrays are refused.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from collectives.calls import table, validate
from collectives.calls.call import Call
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.ops import express
from ring import algorithms
from ring.compression import CODECS, COMPRESSIBLE, Codec
from ring.arrays import is_array, transportable, xp_of
from ring.partition import chunk_bounds
from ring.transport.gpu import device as device_transports, nccl as nccl_transport
from ring.transport.base import Transport


def flat(x: Any) -> Any:
    """A flat C-order view of ``x`` when it is contiguous, else a flat copy (which is then ours)."""
    if x.flags.c_contiguous:
        return x if x.ndim == 1 else x.reshape(-1)
    return xp_of(x).ascontiguousarray(x).reshape(-1)


def flat_target(result: Any) -> Any:
    """Where to compute ``result``: its own flat view when contiguous, else a new flat buffer."""
    if result.flags.c_contiguous:
        return result if result.ndim == 1 else result.reshape(-1)
    return xp_of(result).empty(result.size, result.dtype)


def write_back(result: Any, flat: Any) -> Any:
    """Copy ``flat`` into ``result`` unless it already is ``result``'s own memory (see flat_target)."""
    if not result.flags.c_contiguous:
        result[...] = flat.reshape(result.shape)
    return result


def widened(x: Any) -> tuple[Any, bool]:
    """``x`` as a reduction computes it, and whether that is a copy: a bfloat16 array is reduced in
    float32 and rounded to bfloat16 once at the end (gloo rounds after every addition), for twice
    its bytes on the wire; any other array is reduced as it is."""
    if x.dtype.isbuiltin == 2 and validate.is_bfloat16(x.dtype):
        return x.astype(np.float32), True
    return x, False


def choose(call: Call, collective: str, nbytes: int, host: bool, wire_ratio: float = 1.0) -> str:
    """The algorithm of ``collective`` (as ``ring.cost`` names it) this call runs for ``nbytes``:
    the runtime's choice, or the one it forces, which must be able to carry the call (a usage
    error otherwise); kept as ``call.algorithm``. ``wire_ratio``: a compressed all-reduce's bytes on
    the wire per byte of data (``ring.cost``)."""
    g, forced = call.group, call.forced
    if forced is None:
        key = (collective, g.transport.size, nbytes, host, host and g.levels is not None)
        if wire_ratio != 1.0:
            key += (wire_ratio,)
        found = call.runtime.chosen(key) or call.runtime.algorithm_for(*key)
    else:
        found = forced
        why = _cannot_carry(call, forced, nbytes, host)
        if why:
            call.reject(CollectiveUsageError(f"{call.name}: algorithm: {forced!r} cannot run this call: {why}"))
    call.algorithm = found
    return found


def transport_for(call: Call, x: Any) -> Transport:
    """The transport of ``call``'s group that carries ``x`` (see ``Transports.for_array``)."""
    return call.group.transports.for_array(x, call, call.runtime.settings.gpu_transport)


def predicted(g, collective: str, x: Any) -> str:
    """The algorithm a call of ``collective`` on array ``x`` would run on group ``g``, forcing none
    (see ``Group.algorithm_for``): what :func:`choose` returns, for the bytes it is given."""
    if collective not in _SIZED:
        raise CollectiveUsageError(f"algorithm_for: collective: expected one of {', '.join(map(repr, _SIZED))}, "
                                   f"got {collective!r}")
    if not is_array(x):
        validate.fail("algorithm_for", "x", f"expected a numpy.ndarray (or a cupy.ndarray), got {type(x).__name__}")
    host = isinstance(x, np.ndarray)
    n = g.transport.size
    nbytes = _gathered_guess(n, x.nbytes) if collective == "allgather" else x.nbytes
    return g.runtime.algorithm_for(collective, n, nbytes, host, host and g.levels is not None)


_COUNTS_BYTES = 16   # (the two counts of 8 bytes each that an all-gather's rank sends with its rows)


def _gathered_guess(n: int, nbytes: int) -> int:
    """What an all-gather chooses its algorithm for: every rank's message if all bring ``nbytes``
    (the rows, and its counts)."""
    return n * (nbytes + _COUNTS_BYTES)


_SIZED = table.SIZED


def _cannot_carry(call: Call, forced: str, nbytes: int, host: bool) -> str:
    """Why the algorithm ``forced`` cannot run this call ("" if it can)."""
    largest = call.runtime.settings.small_bytes   # (at most ring.doubling's MAX_PAYLOAD_BYTES: see config)
    if not host and forced != "ring":
        return "GPU arrays run the ring only"
    if forced == "doubling" and nbytes > largest:
        counts = f" (the ranks' rows, and {_COUNTS_BYTES} bytes of counts from each)" \
            if call.name == "allgather" else ""
        return f"'doubling' carries at most small_bytes ({largest}) bytes, this call {nbytes}{counts}"
    if forced == "hierarchical" and call.group.levels is None:
        return "this group's ranks are not on several hosts with the same number, more than one, on each"
    return ""


_COMPRESSIBLE = frozenset(COMPRESSIBLE)


def wire_codec(collective: str, value: Any, x: Any, op: str, argument: str = "x") -> Codec | None:
    """The codec of ``compression=`` (``value``) for an all-reduce of ``x`` (checked already) by
    ``op``: None for None, else one of ``ring.compression.CODECS`` for float32, float64 or bfloat16
    host data that is summed or averaged; anything else is a usage error that names it.

    >>> wire_codec("allreduce", "bf16", np.zeros(2, np.int32), "sum")     # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    collectives.errors.CollectiveUsageError: allreduce: compression: 'bf16' needs float32, ..., x is int32 (...)
    """
    if value is None:
        return None
    if not isinstance(value, str) or value not in CODECS:
        validate.fail(collective, "compression", f"unknown compression {value!r}; expected None, "
                                                 f"{', '.join(map(repr, CODECS))}")
    if op not in ("sum", "avg"):
        validate.fail(collective, "compression", f"{value!r} carries 'sum' and 'avg' only, op is {op!r} "
                                                 "(pass compression=None)")
    if not isinstance(x, np.ndarray):
        validate.fail(collective, "compression", f"{value!r} is not implemented for GPU (cupy) arrays, "
                                                 f"{argument} is one (pass compression=None)")
    if x.dtype not in _COMPRESSIBLE and not validate.is_bfloat16(x.dtype):
        why = ("integers would lose digits" if x.dtype.kind in "iub" else
               "it has two bytes already" if x.dtype == np.float16 else "only real floating-point data is compressed")
        validate.fail(collective, "compression", f"{value!r} needs float32, float64 or bfloat16 data, "
                                                 f"{argument} is {x.dtype} ({why}: pass compression=None)")
    return CODECS[value]


def allreduce(call: Call, x: Any, op: Any, out: Any, compression: Any = None) -> Any:
    x, out, in_place = validate.reduction(call.name, x, op, out)
    codec = wire_codec(call.name, compression, x, op) if compression is not None else None
    host = type(x) is np.ndarray
    sig = call.signature(op, x.dtype, x.shape, memory="host" if host else "gpu", compression=compression or "")
    call.nbytes = x.nbytes
    result = out if out is not None else (np if host else xp_of(x)).empty(x.shape, x.dtype)
    if x.dtype.isbuiltin == 2:   # (bfloat16: see widened)
        source, _ = widened(flat(x))
        allreduce_flat(call, source, source, op, sig, host, codec=codec)
        result[...] = source.reshape(result.shape)
        return result
    if x.ndim == 1 and result.ndim == 1 and x.flags.c_contiguous and result.flags.c_contiguous:
        source, target = x, result   # (flat already: what flat and flat_target give, one call less each)
    else:
        source = flat(x)
        target = source if in_place else flat_target(result)
    allreduce_flat(call, source, target, op, sig, host, codec=codec)
    if host and codec is None:
        express.open_lane(call, x, op)   # (the calls of this kind that follow skip the layers above)
    return result if target is result else write_back(result, target)   # (is: nothing to write back)


def allreduce_flat(call: Call, source: Any, target: Any, op: str, sig: bytes, host: bool,
                   checked: bool = False, codec: Codec | None = None) -> None:
    """All-reduce flat contiguous ``source`` into ``target``: recursive doubling carries the check
    along; the others run after the check (unless ``checked`` already). ``codec``: the codec of a
    compressed call (``ring.compression``), which the ring, halving and the step across hosts of
    two levels carry; recursive doubling's few small messages run uncompressed, which leaves the
    exact sum, the same on every rank."""
    ratio = 1.0 if codec is None else codec.wire_dtype.itemsize / source.dtype.itemsize
    algorithm = choose(call, "allreduce", source.nbytes, host, ratio)
    g = call.group
    if algorithm == "doubling":
        if not algorithms.allreduce_small(g.transport, call, source, target, op, sig):
            call.disagree(sig)
        return
    if not checked:
        call.agree(sig)
    segment = call.runtime.segment_elems
    if algorithm == "hierarchical":
        local, across = g.levels
        algorithms.allreduce_two_level(local, across, call, source, target, op, segment(source.dtype, local),
                                       segment(source.dtype, across), codec)
    elif algorithm == "halving":
        algorithms.allreduce_halving_doubling(g.transport, call, source, target, op,
                                              segment(source.dtype, g.transport), codec)
    else:
        transport = transport_for(call, source)
        algorithms.allreduce(transport, call, source, target, op, segment(source.dtype, transport), codec)


def allreduce_many(call: Call, arrays: Any, op: Any, compression: Any = None) -> list:
    plain = validate.array_list(call.name, "arrays", arrays, op)
    codec = None
    if compression is not None:
        for i, a in enumerate(plain or [np.empty(0, np.float32)]):   # (no arrays: the name and op still)
            codec = wire_codec(call.name, compression, a, op, f"arrays[{i}]")
    host = not plain or type(plain[0]) is np.ndarray
    by_dtype: dict = {}
    layout, nbytes = [], 0
    for a in plain:
        by_dtype.setdefault(a.dtype, []).append(a)
        layout.append(f"{a.dtype.str}{a.shape}")
        nbytes += a.nbytes
    sig = call.signature(op, shape=tuple(layout), memory=("host" if host else "gpu") if plain else "",
                         compression=compression or "")
    call.nbytes = nbytes
    checked = False
    for members in by_dtype.values():
        if len(members) == 1 and members[0].flags.c_contiguous and members[0].dtype.isbuiltin != 2:
            alone = flat(members[0])
            allreduce_flat(call, alone, alone, op, sig, host, checked, codec)
        else:
            fused, _ = widened(xp_of(members[0]).concatenate([m.reshape(-1) for m in members]))
            allreduce_flat(call, fused, fused, op, sig, host, checked, codec)
            offset = 0
            for m in members:
                m[...] = fused[offset:offset + m.size].reshape(m.shape)
                offset += m.size
        checked = True   # by the first dtype's exchange (the small path carries the check)
    if not by_dtype:
        call.agree(sig)
    return arrays


def reduce_scatter(call: Call, x: Any, op: Any, out: Any) -> Any:
    g = call.group
    if type(x) is not np.ndarray:
        x, _, _ = validate.reduction(call.name, x, op, None)   # (refuses what has no size)
    start, stop = chunk_bounds(x.size, g.transport.size)[g.transport.rank]
    x, out, _ = validate.reduction(call.name, x, op, out, (stop - start,))
    host = type(x) is np.ndarray
    sig = call.signature(op, x.dtype, x.shape, memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    xp = np if host else xp_of(x)
    source, wide = widened(flat(x))
    work = source if wide or not x.flags.c_contiguous else xp.empty(x.size, x.dtype)   # (a copy is ours to reuse)
    if choose(call, "reduce_scatter", source.nbytes, host) == "doubling":
        if not algorithms.allreduce_small(g.transport, call, source, work, op, sig):
            call.disagree(sig)
        owned = slice(start, stop)
    else:
        call.agree(sig)
        transport = transport_for(call, x)
        owned = algorithms.reduce_scatter(transport, call, source, work, op,
                                          call.runtime.segment_elems(source.dtype, transport))
    result = out if out is not None else xp.empty(stop - start, x.dtype)
    result[...] = work[owned]
    return result


def allgather(call: Call, x: Any, out: Any) -> Any:
    x, out = validate.gathered(call.name, x, out)
    g, n = call.group, call.group.transport.size
    host = type(x) is np.ndarray
    sig = call.signature(dtype=x.dtype, shape=x.shape[1:], memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    source = x if x.ndim == 1 and x.flags.c_contiguous else flat(x)   # (flat's own test: a call less)
    out_rows = -1 if out is None else out.shape[0]
    small = choose(call, "allgather", _gathered_guess(n, x.nbytes), host) == "doubling"
    found = algorithms.allgather_small(g.transport, call, (x.shape[0], out_rows), source if small else None, sig)
    if found is None:   # (the check rode along)
        call.disagree(sig)
    every, data = found
    result = gathered(call, x, out, source, every, data if small else None)
    if host and small == (call.algorithm == "doubling"):   # (not where rows that differ across ranks went
        # round the ring after the doubling: the next call of this kind, rows alike, takes the doubling)
        express.open_lane(call, x, out_rows, gathered)   # (the calls of this kind that follow skip the layers above)
    return result


def gathered(call: Call, x: Any, out: Any, source: Any, every: np.ndarray, rows: np.ndarray | None) -> Any:
    """The rest of an all-gather of ``x`` (``source``: flat) into ``out`` once ``every`` rank's counts
    (its rows, its ``out``'s rows or -1) have travelled (``algorithms.allgather_small``), and with them
    every rank's bytes (``rows``, None: not sent) on the guess that each brings as many rows as this
    one: where every rank does, they are the result; else the ring carries the data."""
    g, n = call.group, call.group.transport.size
    rows_of, outs = every[:, 0].tolist(), every[:, 1].tolist()
    total = sum(rows_of)
    if outs.count(-1) + outs.count(total) != n:   # known on every rank alike
        wrong = [g.ranks[r] for r, given in enumerate(outs) if given not in (-1, total)]
        raise CollectiveUsageError(f"allgather: out: axis 0 must be {total} (the rows of every rank together), "
                                   f"but is not on rank(s) {', '.join(map(str, wrong))}")
    host = type(x) is np.ndarray
    result = out if out is not None else (np if host else xp_of(x)).empty((total,) + x.shape[1:], x.dtype)
    target = result if result.ndim == 1 and result.flags.c_contiguous else flat_target(result)
    if rows is not None and rows_of.count(x.shape[0]) == n:   # the guess held (on every rank alike)
        target.view(np.uint8)[...] = rows
    else:
        if rows is not None:
            call.algorithm = "ring"   # (the counts travelled by doubling, the data goes round the ring)
        row = math.prod(x.shape[1:])
        transport = transport_for(call, x)
        algorithms.allgather(transport, call, transportable(source), transportable(target), [r * row for r in rows_of],
                             call.runtime.segment_elems(x.dtype, transport))
    return result if target is result else write_back(result, target)


def broadcast(call: Call, x: Any, root: Any) -> Any:
    g = call.group
    me = g.transport.rank
    x, root = validate.broadcast(call.name, x, root, g.transport.size, g.is_world, me)
    host = type(x) is np.ndarray
    sig = call.signature(dtype=x.dtype, shape=x.shape, root=root, memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    flat_already = x.ndim == 1 and x.flags.c_contiguous   # (what flat and flat_target give: a call less each)
    buffer = x if flat_already else flat(x) if me == root else flat_target(x)
    if choose(call, "broadcast", x.nbytes, host) == "doubling":
        if not algorithms.broadcast_small(g.transport, call, buffer, root, sig):
            call.disagree(sig)
        if host:
            express.open_lane(call, x, root)   # (the calls of this kind that follow skip the layers above)
    else:
        call.agree(sig)
        transport = transport_for(call, x)
        algorithms.broadcast(transport, call, transportable(buffer), root,
                             call.runtime.segment_elems(x.dtype, transport))
        if host:
            express.open_lane(call, x, root)   # (on two ranks: see express.open_lane)
    return x if me == root or flat_already else write_back(x, buffer)


def barrier(call: Call) -> None:
    call.agree(call.signature(), always=True)   # the exchange itself is the barrier


def use_local_gpu(call: Call) -> int:
    call.agree(call.signature())
    return call.group.transports.open_device(None, call, call.runtime.settings.gpu_transport)


def nccl_communicator(call: Call) -> Any:
    call.agree(call.signature())
    host = call.group.transport
    try:
        device_transports.agree(host, None, "nccl", call)   # (the same verdict on every rank)
    except device_transports.Unavailable as e:
        raise CollectiveError(f"{call.name}: {e}") from e
    return nccl_transport.connect(host, call).comm
