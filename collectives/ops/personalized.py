"""The bodies of the collectives that give each rank's block to one rank (all-to-all, gather,
scatter) and of reduce to a root, once their call has begun (``collectives.calls.call``); the others
are in ``collectives.ops.bodies``, whose helpers these share.

Blocks are cut along axis 0: rows. A rank's rows for each rank (``splits``) may differ, and
so may the rows each rank brings to a gather; the runtime tells every rank the others' counts
(in the cross-rank check's exchange where it can), so that only the data moves after it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from collectives.calls import validate
from collectives.calls.call import Call
from collectives.ops.bodies import choose, flat, flat_target, transport_for, widened, write_back
from collectives.errors import CollectiveUsageError
from ring import algorithms
from ring.arrays import to_host, transportable, xp_of
from ring.partition import bounds_from_counts

_MAX_DIMS = 32   # numpy's limit on dimensions, which a scatter's header must carry


def alltoall(call: Call, x: Any, splits: Any, out: Any, out_splits: Any = None) -> Any:
    g, n = call.group, call.group.transport.size
    x, out = validate.gathered(call.name, x, out)
    rows = validate.splits(call.name, splits, x.shape[0], n)
    expected = [-1] * n if out_splits is None else validate.splits(
        call.name, out_splits, None if out is None else out.shape[0], n, "out_splits", "out")
    host = type(x) is np.ndarray
    sig = call.signature(dtype=x.dtype, shape=x.shape[1:], memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    call.algorithm = "pairwise"
    call.agree(sig, always=True)   # (the counts' exchange below blocks inside MPI: every rank must be here)
    mine = np.array(rows + [-1 if out is None else out.shape[0]] + expected, np.int64)   # (for the checks)
    every = np.frombuffer(b"".join(g.transport.allgather_bytes(mine.tobytes(), call)), np.int64).reshape(n, 2 * n + 1)
    _check_receiving(call, every[:, :n], every[:, n], every[:, n + 1:])
    incoming = every[:, g.transport.rank].tolist()   # the rows each rank sends this one
    total = sum(incoming)
    result = out if out is not None else (np if host else xp_of(x)).empty((total,) + x.shape[1:],
                                                                                       x.dtype)
    row = math.prod(x.shape[1:])
    target = flat_target(result)
    transport = transport_for(call, x)
    algorithms.alltoall(transport, call, transportable(flat(x)), transportable(target),
                        bounds_from_counts([r * row for r in rows]),
                        bounds_from_counts([r * row for r in incoming]),
                        call.runtime.segment_elems(x.dtype, transport))
    return result if target is result else write_back(result, target)


def _check_receiving(call: Call, sent: np.ndarray, out_rows: np.ndarray, expected: np.ndarray) -> None:
    """Raise the same error on every rank if a rank's ``out`` (``out_rows``, -1: none) or its
    ``out_splits`` (``expected[r, s]``: rows rank r expects from rank s, -1: any) disagree with
    what the ranks send it (``sent[s, r]``: rows rank s sends rank r)."""
    ranks = call.group.ranks
    totals = sent.sum(axis=0).tolist()   # the rows each rank receives
    wrong = [f"rank {ranks[r]}: {given} for {totals[r]}" for r, given in enumerate(out_rows.tolist())
             if given not in (-1, totals[r])]
    if wrong:
        raise CollectiveUsageError(f"{call.name}: out: axis 0 must be the rows the ranks send to its rank, but is "
                                   f"not ({', '.join(wrong)})")
    wrong = [f"rank {ranks[r]} expects {expected[r, s]} from rank {ranks[s]}, which sends {sent[s, r]}"
             for r, s in zip(*np.nonzero((expected != -1) & (expected != sent.T)))]
    if wrong:
        raise CollectiveUsageError(f"{call.name}: out_splits: must be the rows each rank sends this one, but "
                                   f"{'; '.join(wrong[:8])}{f'; and {len(wrong) - 8} more' if len(wrong) > 8 else ''}")


def gather(call: Call, x: Any, root: Any, out: Any) -> Any:
    g = call.group
    me = g.transport.rank
    x, out = validate.gathered(call.name, x, out)
    root = validate.root(call.name, root, g.transport.size, g.is_world)
    host = type(x) is np.ndarray
    sig = call.signature(dtype=x.dtype, shape=x.shape[1:], root=root, memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    call.algorithm = "linear"
    given = -1 if out is None else out.shape[0]   # (checked on every rank that passes one, as its dtype is)
    found = algorithms.allgather_small(g.transport, call, (x.shape[0], given), None, sig)   # (carries the check)
    if found is None:
        call.disagree(sig)
    every = found[0]
    rows = every[:, 0].tolist()
    total = sum(rows)
    wrong = [r for r in range(len(rows)) if every[r, 1] not in (-1, total)]   # known on every rank alike
    if wrong:
        where = "the root, rank" if wrong[0] == root else "rank"
        raise CollectiveUsageError(f"{call.name}: out: axis 0 must be {total} (the rows of every rank together), "
                                   f"but is {every[wrong[0], 1]} on {where} {g.ranks[wrong[0]]}")
    result = target = None
    if me == root:
        result = out if out is not None else (np if host else xp_of(x)).empty(
            (total,) + x.shape[1:], x.dtype)
        target = flat_target(result)
    row = math.prod(x.shape[1:])
    transport = transport_for(call, x)
    algorithms.gather(transport, call, transportable(flat(x)), None if target is None else transportable(target), root,
                      [r * row for r in rows], call.runtime.segment_elems(x.dtype, transport))
    return None if result is None else result if target is result else write_back(result, target)


def scatter(call: Call, x: Any, root: Any, splits: Any, out: Any = None) -> Any:
    g, n = call.group, call.group.transport.size
    me = g.transport.rank
    root = validate.root(call.name, root, n, g.is_world)
    out = _scatter_out(call.name, out)
    if me == root:
        x, _ = validate.gathered(call.name, x, None)
        rows = validate.splits(call.name, splits, x.shape[0], n)
        code = validate.header_code(call.name, "x", x.dtype)
        if x.ndim > _MAX_DIMS:
            validate.fail(call.name, "x", f"has {x.ndim} dimensions, more than numpy's {_MAX_DIMS}")
        if out is not None and (out.dtype != x.dtype or out.shape[1:] != x.shape[1:]):
            validate.fail(call.name, "out", f"expected rows like x's ({x.dtype}, trailing shape "
                                            f"{x.shape[1:]}), got {out.dtype} {out.shape[1:]}")
    if me == root and type(x) is not np.ndarray:
        x = to_host(x)   # (the others cannot know the root's memory: a scatter moves through the host)
    header = np.zeros(2 + _MAX_DIMS + n, np.int64)   # dtype, dimensions, shape, then the rows of each rank
    if me == root:
        header[0], header[1] = code, x.ndim
        header[2:2 + x.ndim - 1] = x.shape[1:]
        header[2 + _MAX_DIMS:] = rows
    sig = call.signature(root=root) if out is None else call.signature(dtype=out.dtype, shape=out.shape[1:],
                                                                       root=root)
    if not algorithms.broadcast_small(g.transport, call, header, root, sig):   # (carries the check)
        call.disagree(sig)
    dtype, ndim = validate.header_dtype(int(header[0])), int(header[1])
    trailing = tuple(header[2:2 + ndim - 1].tolist())
    rows = header[2 + _MAX_DIMS:].tolist()
    call.nbytes = x.nbytes if me == root else 0
    call.algorithm = "linear"
    fits = out is not None and out.shape == (rows[me],) + trailing   # (dtype and trailing shape: checked above)
    result = out if fits else np.empty((rows[me],) + trailing, dtype)
    target = flat_target(result)
    row = math.prod(trailing)
    algorithms.scatter(g.transport, call, transportable(flat(x)) if me == root else None, transportable(target),
                       root, [r * row for r in rows], call.runtime.segment_elems(dtype, g.transport))
    if out is not None and not fits:   # (the call is done on every rank; only this rank's out was wrong)
        raise CollectiveUsageError(f"{call.name}: out: expected {rows[me]} rows for rank {g.ranks[me]} (the root's "
                                   f"splits), got {out.shape[0]}; out was left as it was")
    return write_back(result, target)


def _scatter_out(collective: str, out: Any) -> np.ndarray | None:
    """A scatter's ``out``: None, or a writable numpy array of at least one dimension (a scatter
    moves through host memory)."""
    if out is None:
        return None
    out = validate.plain(collective, "out", out)
    if type(out) is not np.ndarray or out.ndim == 0 or out.dtype.hasobject:
        validate.fail(collective, "out", f"expected a numpy array of at least one dimension, got "
                                         f"{getattr(out, 'shape', type(out).__name__)}")
    validate.writable(collective, "out", out)
    return out


def reduce(call: Call, x: Any, op: Any, root: Any, out: Any) -> Any:
    g = call.group
    me = g.transport.rank
    x, out, in_place = validate.reduction(call.name, x, op, out)
    root = validate.root(call.name, root, g.transport.size, g.is_world)
    host = type(x) is np.ndarray
    sig = call.signature(op, x.dtype, x.shape, root=root, memory="host" if host else "gpu")
    call.nbytes = x.nbytes
    xp = np if host else xp_of(x)
    result = (out if out is not None else xp.empty(x.shape, x.dtype)) if me == root else None
    source, wide = widened(flat(x))
    direct = me == root and not wide   # (the root reduces into the result itself)
    target = (source if in_place else flat_target(result)) if direct else xp.empty(source.size, source.dtype)
    if choose(call, "allreduce", source.nbytes, host) == "doubling":
        if not algorithms.allreduce_small(g.transport, call, source, target, op, sig):
            call.disagree(sig)
    else:
        call.algorithm = "ring"
        call.agree(sig)
        transport = transport_for(call, x)
        algorithms.reduce(transport, call, source, target, root, op,
                          call.runtime.segment_elems(source.dtype, transport))
    if result is None:
        return None
    if direct:
        return write_back(result, target)
    result[...] = target.reshape(result.shape)   # (rounds a widened bfloat16 sum once)
    return result
