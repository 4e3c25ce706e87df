"""The public collectives: validate, agree across ranks, pick flat contiguous buffers, run, return.

Any shape and memory layout is accepted: the ring works on the C-order flattening
of the array. Contiguous arrays are used as they are; others go through one
contiguous copy, and the result is written back in the caller's layout.

Every collective first checks that all ranks make the same call (``collectives.call``),
takes ``timeout=`` (seconds) to bound its waiting (see ``collectives.world`` for the
defaults), and takes ``name=``: a string, the same on every rank, that the check
compares too. Calls that look alike (the same collective, dtype and shape) can only
be told apart by it: ``allreduce(grads, name=f"step {step}")`` turns a rank that
skipped a step into a CollectiveUsageError instead of results paired with the wrong
step. A numpy subclass (``np.matrix``) is used through a plain ndarray view, and
results are plain arrays; masked arrays are refused.

numpy arrays move over MPI. cupy arrays run the same ring over NCCL, or staged
through host memory over MPI where NCCL cannot carry them (``COLLECTIVES_GPU_TRANSPORT``),
with the reductions on the GPU. A GPU call returns with its work queued on the
current CuPy stream: the result is ready for anything queued after it there.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from collectives import validate
from collectives.call import Call, begin, collective
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.group import Group, NonMember
from ring import algorithms
from ring.arrays import xp_of
from ring.partition import chunk_bounds
from ring.transport.base import CommunicatorsExhausted


def _flat(x: np.ndarray) -> np.ndarray:
    """A flat C-order view of ``x`` when it is contiguous, else a flat copy (which is then ours)."""
    if x.flags.c_contiguous:
        return x if x.ndim == 1 else x.reshape(-1)
    return xp_of(x).ascontiguousarray(x).reshape(-1)


def _flat_target(result: np.ndarray) -> np.ndarray:
    """Where to compute ``result``: its own flat view when contiguous, else a new flat buffer."""
    if result.flags.c_contiguous:
        return result if result.ndim == 1 else result.reshape(-1)
    return xp_of(result).empty(result.size, result.dtype)


def _memory(x) -> str:
    """Which memory ``x`` lives in, as the cross-rank check compares it."""
    return "host" if isinstance(x, np.ndarray) else "gpu"


def _write_back(result: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Copy ``flat`` into ``result`` unless it already is ``result``'s own memory (see _flat_target)."""
    if not result.flags.c_contiguous:
        result[...] = flat.reshape(result.shape)
    return result


@collective("allreduce")
def allreduce(x: np.ndarray, op: str = "sum", out: np.ndarray | None = None, *, group: Group | None = None,
              async_op: bool = False, timeout: float | None = None, name: str | None = None) -> np.ndarray:
    """Reduce ``x`` elementwise across all ranks; every rank gets the same bits.

    ``op`` is "sum", "avg", "min", "max" or "prod". ``out=x`` reduces in place;
    without ``out`` a new array is returned and ``x`` is not modified. The algorithm is
    the one the cost model (``ring.cost``) predicts fastest for the size and the group:
    recursive doubling for small buffers, Rabenseifner's halving and doubling in the
    middle, the bandwidth-optimal ring for large ones (and two levels across hosts).

    >>> col.allreduce(np.full(3, col.rank() + 1.0))       # on 3 ranks  # doctest: +SKIP
    array([6., 6., 6.])
    """
    call = begin("allreduce", group, timeout, name)
    try:
        validate.timeout("allreduce", timeout)
        x, out = validate.inputs("allreduce", x, out, name)
        validate.reducible("allreduce", "x", x, op)
        in_place = out is not None and validate.out_array("allreduce", out, x, x.shape)
    except CollectiveUsageError as error:
        call.reject(error)
    sig = call.signature(op=op, dtype=x.dtype, shape=x.shape, memory=_memory(x))
    result = out if out is not None else xp_of(x).empty(x.shape, x.dtype)
    source = _flat(x)
    target = source if in_place else _flat_target(result)
    _allreduce_flat(call, source, target, op, sig)
    return _write_back(result, target)


def _allreduce_flat(call: Call, source, target, op: str, sig: bytes, checked: bool = False) -> None:
    """All-reduce flat contiguous ``source`` into ``target`` by the group's algorithm for its size
    (``Runtime.algorithm_for``): recursive doubling carries the check along; the others run after
    the check (unless ``checked`` already)."""
    g, runtime = call.group, call.runtime
    host = isinstance(source, np.ndarray)
    algorithm = runtime.algorithm_for("allreduce", g.size(), source.nbytes, host)
    if algorithm == "doubling":
        call.settle(algorithms.allreduce_small(g.transport, source, target, op, sig), sig)
        return
    if not checked:
        call.agree(sig)
    if g.levels is not None and host:
        local, across = g.levels
        algorithms.allreduce_two_level(local, across, source, target, op, runtime.segment_elems(source.dtype, local),
                                       runtime.segment_elems(source.dtype, across))
    elif algorithm == "halving":
        algorithms.allreduce_halving_doubling(g.transport, source, target, op,
                                              runtime.segment_elems(source.dtype, g.transport))
    else:
        transport = g.transport_for(source)
        algorithms.allreduce(transport, source, target, op, runtime.segment_elems(source.dtype, transport))


@collective("allreduce_many")
def allreduce_many(arrays: list, op: str = "sum", *, group: Group | None = None, async_op: bool = False,
                   timeout: float | None = None, name: str | None = None) -> list:
    """All-reduce every array in the list ``arrays`` in place, as one fused operation; returns ``arrays``.

    Arrays of one dtype are packed into one buffer (Horovod's tensor fusion), so many small
    gradients cost one ring, not one each; a dtype with a single contiguous array is reduced
    where it lies. Any shapes; several dtypes are reduced one buffer per dtype, in order of
    first appearance. The arrays must be writable, all numpy or all cupy, and share no memory.

    >>> w, b = np.ones((2, 3)), np.arange(3.0)                       # doctest: +SKIP
    >>> col.allreduce_many([w, b], op="avg")                         # doctest: +SKIP
    """
    call = begin("allreduce_many", group, timeout, name)
    try:
        validate.timeout("allreduce_many", timeout)
        validate.call_name("allreduce_many", name)
        plain = validate.array_list("allreduce_many", "arrays", arrays, op)
    except CollectiveUsageError as error:
        call.reject(error)
    layout = tuple(f"{a.dtype.str}{a.shape}" for a in plain)
    sig = call.signature(op=op, shape=layout, memory=_memory(plain[0]) if plain else "")
    call.nbytes = sum(a.nbytes for a in plain)
    groups: dict = {}
    for a in plain:
        groups.setdefault(a.dtype, []).append(a)
    checked = False
    for members in groups.values():
        if len(members) == 1 and members[0].flags.c_contiguous:
            flat = _flat(members[0])
            _allreduce_flat(call, flat, flat, op, sig, checked)
        else:
            fused = xp_of(members[0]).concatenate([m.reshape(-1) for m in members])
            _allreduce_flat(call, fused, fused, op, sig, checked)
            offset = 0
            for m in members:
                m[...] = fused[offset:offset + m.size].reshape(m.shape)
                offset += m.size
        checked = True   # by the first group's exchange (the small path carries the check)
    if not groups:
        call.agree(sig)
    return arrays


@collective("reduce_scatter")
def reduce_scatter(x: np.ndarray, op: str = "sum", out: np.ndarray | None = None, *, group: Group | None = None,
                   async_op: bool = False, timeout: float | None = None, name: str | None = None) -> np.ndarray:
    """Reduce ``x`` across ranks; return this rank's block of the flattened result.

    Blocks are split like ``np.array_split(x.ravel(), size())``: with 10 elements
    on 3 ranks, rank 0 gets elements 0-3, rank 1 gets 4-6, rank 2 gets 7-9.

    >>> col.reduce_scatter(np.arange(10.0))               # rank 1 of 3  # doctest: +SKIP
    array([12., 15., 18.])
    """
    call = begin("reduce_scatter", group, timeout, name)
    g = call.group
    try:
        validate.timeout("reduce_scatter", timeout)
        x, out = validate.inputs("reduce_scatter", x, out, name)
        validate.reducible("reduce_scatter", "x", x, op)
        owned_start, owned_stop = chunk_bounds(x.size, g.size())[g.rank()]
        if out is not None:
            validate.out_array("reduce_scatter", out, x, (owned_stop - owned_start,))
    except CollectiveUsageError as error:
        call.reject(error)
    sig = call.signature(op=op, dtype=x.dtype, shape=x.shape, memory=_memory(x))
    xp = xp_of(x)
    source = _flat(x)
    work = xp.empty(x.size, x.dtype) if x.flags.c_contiguous else source   # a copy of x is ours to reuse
    if call.runtime.algorithm_for("reduce_scatter", g.size(), x.nbytes, xp is np) == "doubling":
        call.settle(algorithms.allreduce_small(g.transport, source, work, op, sig), sig)
        owned = slice(owned_start, owned_stop)
    else:
        call.agree(sig)
        transport = g.transport_for(x)
        owned = algorithms.reduce_scatter(transport, source, work, op, call.runtime.segment_elems(x.dtype, transport))
    result = out if out is not None else xp.empty(owned_stop - owned_start, x.dtype)
    result[...] = work[owned]
    return result


@collective("allgather")
def allgather(x: np.ndarray, out: np.ndarray | None = None, *, group: Group | None = None, async_op: bool = False,
              timeout: float | None = None, name: str | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0, in rank order; axis 0 may differ between ranks.

    ``out``: where to write the result (its axis 0 must be the sum over the ranks), instead
    of a new array; it must not overlap ``x``. Writing into the same ``out`` call after call
    saves allocating, which for large results costs more than the transfer (page faults).

    >>> col.allgather(np.full((col.rank() + 1, 2), col.rank()))   # on 2 ranks  # doctest: +SKIP
    array([[0, 0],
           [1, 1],
           [1, 1]])
    """
    call = begin("allgather", group, timeout, name)
    try:
        validate.timeout("allgather", timeout)
        x, out = validate.inputs("allgather", x, out, name)
        validate.array("allgather", "x", x)
        if x.ndim == 0:
            validate.fail("allgather", "x", "is 0-dimensional; allgather concatenates along axis 0")
        if out is not None:
            if getattr(out, "ndim", None) != x.ndim:
                validate.fail("allgather", "out", f"expected {x.ndim} dimension(s) like x, got "
                                                  f"{getattr(out, 'ndim', type(out).__name__)}")
            if validate.out_array("allgather", out, x, out.shape[:1] + x.shape[1:]):
                validate.fail("allgather", "out", "is x itself; the result must go elsewhere")
    except CollectiveUsageError as error:
        call.reject(error)
    g, n = call.group, call.group.size()
    sig = call.signature(dtype=x.dtype, shape=x.shape[1:], memory=_memory(x))
    source = _flat(x)
    mine = (x.shape[0], -1 if out is None else out.shape[0])
    guess = n * (x.nbytes + 8 * len(mine))   # if every rank brings as many rows: the data and the counts
    small = call.runtime.algorithm_for("allgather", n, guess, isinstance(x, np.ndarray)) == "doubling"
    found = algorithms.gather_small(g.transport, mine, source if small else None, sig)   # (carries the check)
    if found is None:
        call.settle(False, sig)
    every, gathered = found
    rows = every[:, 0].tolist()
    total = sum(rows)
    wrong = [g.ranks[r] for r, given in enumerate(every[:, 1].tolist()) if given not in (-1, total)]
    if wrong:   # known on every rank alike
        raise CollectiveUsageError(f"allgather: out: axis 0 must be {total} (the rows of every rank together), "
                                   f"but is not on rank(s) {', '.join(map(str, wrong))}")
    result = out if out is not None else xp_of(x).empty((total,) + x.shape[1:], x.dtype)
    target = _flat_target(result)
    if small and rows.count(x.shape[0]) == n:   # the guess held (on every rank alike): as many rows everywhere
        target.view(np.uint8)[...] = gathered
    else:
        row = math.prod(x.shape[1:])
        transport = g.transport_for(x)
        algorithms.allgather(transport, source, target, [r * row for r in rows],
                             call.runtime.segment_elems(x.dtype, transport))
    return _write_back(result, target)


@collective("broadcast")
def broadcast(x: np.ndarray, root: int = 0, *, group: Group | None = None, async_op: bool = False,
              timeout: float | None = None, name: str | None = None) -> np.ndarray:
    """Overwrite ``x`` on every rank with ``root``'s ``x``, in place; returns ``x``.

    Small buffers travel by recursive doubling inside the cross-rank check's messages; larger
    ones along a pipelined chain around the ring, at nearly one link's bandwidth whatever the
    number of ranks (the cost model chooses: ``ring.cost``).

    >>> params = col.broadcast(params, root=0)                         # doctest: +SKIP
    """
    call = begin("broadcast", group, timeout, name)
    g = call.group
    try:
        validate.timeout("broadcast", timeout)
        x, _ = validate.inputs("broadcast", x, name=name)
        validate.array("broadcast", "x", x)
        validate.root("broadcast", root, g.size(), g.is_world)
        if g.rank() != root:
            validate.writable("broadcast", "x", x)
    except CollectiveUsageError as error:
        call.reject(error)
    sig = call.signature(dtype=x.dtype, shape=x.shape, root=int(root), memory=_memory(x))
    buffer = _flat(x) if g.rank() == root else _flat_target(x)
    host = isinstance(x, np.ndarray)
    if call.runtime.algorithm_for("broadcast", g.size(), x.nbytes, host) == "doubling":
        call.settle(algorithms.broadcast_small(g.transport, buffer, int(root), sig), sig)
    else:
        call.agree(sig)
        transport = g.transport_for(x)
        algorithms.broadcast(transport, buffer, int(root), call.runtime.segment_elems(x.dtype, transport))
    return _write_back(x, buffer) if g.rank() != root else x


@collective("barrier")
def barrier(*, group: Group | None = None, async_op: bool = False, timeout: float | None = None,
            name: str | None = None) -> None:
    """Return once every rank has entered the barrier (and checks that they all meant to)."""
    call = begin("barrier", group, timeout, name)
    try:
        validate.timeout("barrier", timeout)
        validate.call_name("barrier", name)
    except CollectiveUsageError as error:
        call.reject(error)
    sig = call.signature()
    call.agree(sig, always=True)   # the exchange itself is the barrier


@collective("use_local_gpu")
def use_local_gpu(*, timeout: float | None = None) -> int:
    """Give this rank its own GPU, the same way on every rank; return the GPU's index.

    Makes GPU ``local_rank() % visible GPUs`` current and sets up the transport for
    cupy arrays (NCCL, or staged through the host: ``COLLECTIVES_GPU_TRANSPORT``).
    Every rank calls it together, before making cupy arrays. If any rank has no
    usable GPU, every rank raises the same CollectiveError. Without it, the first
    collective on a cupy array does the same for the GPU that array is on.

    >>> import cupy, collectives as col                              # doctest: +SKIP
    >>> gpu = col.use_local_gpu()                                    # doctest: +SKIP
    >>> g = cupy.ones(1 << 20, cupy.float32); col.allreduce(g, out=g)  # doctest: +SKIP
    """
    call = begin("use_local_gpu", None, timeout)
    try:
        validate.timeout("use_local_gpu", timeout)
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature())
    return call.group.open_device_transport(None)


@collective("new_group")
def new_group(ranks, *, group: Group | None = None, timeout: float | None = None,
              name: str | None = None) -> Group | NonMember:
    """Make a group of the world ranks ``ranks``, in that order (group rank i is ``ranks[i]``).

    Every rank of the world (of ``group``, whose members ``ranks`` must be) calls it with the
    same list, as in torch.distributed; members get the :class:`Group`, the others a falsy
    ``NonMember``. Ranks that disagree about the list, or a rank making another call, make
    every rank raise CollectiveUsageError (this check is made even with COLLECTIVES_CHECK=0).

    >>> evens = col.new_group(range(0, col.size(), 2))   # doctest: +SKIP
    >>> if evens:                                        # doctest: +SKIP
    ...     evens.allreduce(x)
    """
    call = begin("new_group", group, timeout, name)
    parent = call.group
    try:
        validate.timeout("new_group", timeout)
        validate.call_name("new_group", name)
        members = validate.members("new_group", "ranks", ranks, parent.ranks)
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(shape=members), always=True)   # a split blocks inside MPI: every rank must come
    me = parent.ranks[parent.rank()]
    inside = me in members
    return _joined(call, lambda: parent.transport.split(0 if inside else None, members.index(me) if inside else 0),
                   members)


@collective("split")
def split(color: int | None, key: int = 0, *, group: Group | None = None, timeout: float | None = None,
          name: str | None = None) -> Group | NonMember:
    """Split the world (or ``group``) into groups by ``color``, as MPI's Comm_split: every rank calls
    it, and the ranks that pass the same color form one group, ordered by ``key``, then by rank.

    ``color``: an int >= 0, or None for no group (the rank gets a falsy ``NonMember``).

    >>> rows = col.split(col.rank() // 2)     # 4 ranks: [0, 1] and [2, 3]   # doctest: +SKIP
    >>> cols = col.split(col.rank() % 2)      #          [0, 2] and [1, 3]   # doctest: +SKIP
    """
    call = begin("split", group, timeout, name)
    try:
        validate.timeout("split", timeout)
        validate.call_name("split", name)
        validate.color("split", color)
        validate.integer("split", "key", key)
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(), always=True)   # (as in new_group)
    return _joined(call, lambda: call.group.transport.split(color, int(key)), ())


def _joined(call: Call, split: Callable, members: tuple[int, ...]) -> Group | NonMember:
    """The group on the transport ``split()`` makes, or, for a rank left out (None), its marker.
    MPI running out of communicators fails alike on every rank (the new one's context id is agreed
    by all): a CollectiveError that leaves the ranks in step, so that destroying groups helps."""
    parent, made = call.group, None
    try:
        made = split()
        if made is None:
            return NonMember(members, parent.ranks[parent.rank()])
        return call.runtime.make_group(made, tuple(made.names))
    except CommunicatorsExhausted as e:
        if made is not None:
            made.close()
        parent.completed = parent.seq
        alive = len(call.runtime.groups) - 1
        raise CollectiveError(f"{call.name}: MPI has no communicators left ({alive} groups alive); destroy groups "
                              f"you no longer use (Group.destroy()) [{e}]") from e


@collective("destroy")
def destroy(*, group: Group | None = None, timeout: float | None = None, name: str | None = None) -> None:
    """Free ``group``'s communicators; every member calls it, as MPI_Comm_free and torch's
    ``destroy_process_group``. Afterwards any call on the group raises CollectiveUsageError.
    MPI has a few thousand communicators per process (MPICH: 2048): a program that makes groups
    in a loop destroys the ones it no longer uses. Same as ``group.destroy()``.

    >>> pair = col.new_group([0, 1])                     # doctest: +SKIP
    >>> if pair:                                         # doctest: +SKIP
    ...     pair.allreduce(x); pair.destroy()
    """
    call = begin("destroy", group, timeout, name)
    try:
        validate.timeout("destroy", timeout)
        validate.call_name("destroy", name)
        if call.group.is_world:
            validate.fail("destroy", "group", "is the world, which lives as long as the runtime; give a group "
                                              "made by new_group or split")
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(), always=True)   # every member is here: none has a call in flight on it
    call.group.release()
