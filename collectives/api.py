"""The module-level collectives: each is the world's method (``collectives.groups.group.Group``), or,
with ``group=``, that group's; one per entry of the table of collectives (``collectives.calls.table``).
The first call sets the world up (``collectives.process.startup.init``).

Also the helpers that programs need beside the calls: where a reduce-scatter's blocks lie
(:func:`block_bounds`), and the two places where host and GPU arrays differ for a caller
(:func:`to_host`, :func:`synchronize`).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np

from collectives.calls import table, validate
from collectives.calls.interrupts import held
from collectives.ops import bodies, express
from collectives.process import startup
from collectives.calls.call import issue
from collectives.groups.group import Group, member
from ring import arrays
from ring.partition import chunk_bounds


def _group(group: object, collective: str, timeout: object) -> Group:
    """``group=`` of a module-level call: the world for None (set up first if need be, within the
    call's ``timeout``), else a group this rank belongs to."""
    world = startup.world(timeout)
    return world if group is None else member(group, collective, world.runtime)


def _on_group(method: Callable) -> Callable:
    """``Group.<method>`` as a module-level function: the same call on ``group=`` (None: the world,
    set up first if need be, within the call's ``timeout``). Each collective is declared once, as
    the method; this adds ``group`` to its signature and its docstring.

    >>> import inspect; list(inspect.signature(broadcast).parameters)
    ['x', 'root', 'group', 'async_op', 'timeout', 'name', 'algorithm']
    """
    name, signature = method.__name__, inspect.signature(method)
    if "timeout" in signature.parameters:   # (named, not read from **kwargs: a call less on the hot path)
        def on_group(*args: Any, group: Group | None = None, timeout: float | None = None, **kwargs: Any) -> Any:
            try:
                g = startup.the_world if group is None else _group(group, name, timeout)
                return method(g or startup.world(timeout), *args, timeout=timeout, **kwargs)
            except KeyboardInterrupt:
                held.on = True   # (see _interrupted)
                _interrupted(name)
                raise
    else:
        def on_group(*args: Any, group: Group | None = None, **kwargs: Any) -> Any:
            return method(_group(group, name, None), *args, **kwargs)

    params = list(signature.parameters.values())[1:]   # (less self)
    at = next((i for i, p in enumerate(params) if p.kind is p.KEYWORD_ONLY), len(params))
    params.insert(at, inspect.Parameter("group", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation="Group | None"))
    on_group.__signature__ = signature.replace(parameters=params)
    on_group.__name__ = on_group.__qualname__ = name
    on_group.__doc__ = (f"{method.__doc__}\n\n        ``group``: the group to run on (None: the world); the same "
                        f"as ``group.{name}(...)``.")
    return on_group


def _through_the_lane(general: Callable) -> Callable:
    """The module's ``allreduce``, ``broadcast`` or ``allgather`` (``general``'s name): a call with no
    option on the world goes straight to its express lane where one is open (``collectives.ops.express``:
    a repeated small call), any other the way of ``general`` (the world's method, ``_on_group``).
    ``group`` and ``algorithm`` are named, not options: a caller that passes their defaults (the bench
    does) takes the lane as fast, and one that forces an algorithm takes a lane kept for it."""
    name = general.__name__

    if name == "allreduce":
        def through(x: Any, op: str = "sum", out: Any = None, *, group: Group | None = None,
                    algorithm: str | None = None, **options: Any) -> Any:
            try:
                world = startup.the_world
                if group is None and not options and world is not None \
                        and (algorithm is None or type(algorithm) is str):
                    fused = world.runtime.fused_allreduce
                    if fused is not None:
                        result = fused(world, x, op, out, algorithm)
                        if result is not None:
                            return result
                    lane = express.allreduce_lane(world, x, op, out, algorithm)
                    if lane is not None:
                        return lane.run(x, out)
            except KeyboardInterrupt:   # (the lanes' way; ``general``'s has its own, as on_group's)
                held.on = True   # (see _interrupted)
                _interrupted(name)
                raise
            return general(x, op, out, group=group, algorithm=algorithm, **options)
    elif name == "broadcast":
        def through(x: Any, root: int = 0, *, group: Group | None = None, algorithm: str | None = None,
                    **options: Any) -> Any:
            try:
                world = startup.the_world
                if group is None and not options and world is not None \
                        and (algorithm is None or type(algorithm) is str):
                    fused = world.runtime.fused_broadcast
                    if fused is not None:
                        result = fused(world, x, root, None, algorithm)
                        if result is not None:
                            return result
                    lane = express.broadcast_lane(world, x, root, algorithm)
                    if lane is not None:
                        return lane.run(x)
            except KeyboardInterrupt:   # (the lanes' way; ``general``'s has its own, as on_group's)
                held.on = True   # (see _interrupted)
                _interrupted(name)
                raise
            return general(x, root, group=group, algorithm=algorithm, **options)
    else:
        def through(x: Any, out: Any = None, *, group: Group | None = None, algorithm: str | None = None,
                    **options: Any) -> Any:
            try:
                world = startup.the_world
                if group is None and not options and world is not None \
                        and (algorithm is None or type(algorithm) is str):
                    fused = world.runtime.fused_allgather
                    if fused is not None:
                        result = fused(world, x, None, out, algorithm)
                        if result is not None:
                            return result
                    lane = express.allgather_lane(world, x, out, algorithm)
                    if lane is not None:
                        return lane.run(x, out)
            except KeyboardInterrupt:   # (the lanes' way; ``general``'s has its own, as on_group's)
                held.on = True   # (see _interrupted)
                _interrupted(name)
                raise
            return general(x, out, group=group, algorithm=algorithm, **options)
    return functools.update_wrapper(through, general)   # (its name, docstring and signature)


def _interrupted(name: str) -> None:
    """A KeyboardInterrupt is leaving a module function's call ``name`` (the caller has set
    ``held.on``: a second Ctrl-C waits): the runtime stops, if the call has not stopped it already.
    Python may run the signal's handler as the call returns through the function's own frame, after
    the call ended in step on every rank; stopped, the runtime makes the program's next call raise
    instead of pairing with the others' next one (``collectives.calls.interrupts``)."""
    try:
        world = startup.the_world
        if world is not None:
            world.runtime.stop(f"rank {world.rank()}: {name} was interrupted by KeyboardInterrupt")
    finally:
        held.on = held.pending = False


# Every collective of the table (``collectives.calls.table``) as a function of this module:
# ``allreduce``, ``allgather``, ... (made once, at import: the call itself is ``on_group``'s).
_FUNCTIONS = {c.name: _on_group(getattr(Group, c.name)) for c in table.COLLECTIVES}
_FUNCTIONS.update({name: _through_the_lane(_FUNCTIONS[name]) for name in express.WITH_LANES})
globals().update(_FUNCTIONS)


def world_group(*, timeout: float | None = None) -> Group:
    """The world as a Group, set up first if need be (within ``timeout``): what the module-level
    calls run on without ``group=``. A value of the world as it is now: after an elastic change
    (``collectives.elastic``) the world is a new Group, and calls on this one raise MembershipChanged.

    >>> world = col.world_group()                      # doctest: +SKIP
    >>> world.size() == col.size(), world.allreduce(grads) is not None   # doctest: +SKIP
    (True, True)
    """
    return startup.world(timeout)


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
    return issue(startup.world(timeout), "use_local_gpu", bodies.use_local_gpu, (), False, timeout)


def nccl_communicator(*, group: Group | None = None, timeout: float | None = None) -> Any:
    """NCCL's own communicator over the group's ranks (``cupy.cuda.nccl.NcclCommunicator``), for a
    program that calls NCCL directly beside the runtime, as ``python -m bench`` does to time NCCL's
    collectives. Every member calls it together, with this rank's GPU current (``use_local_gpu``);
    where NCCL cannot serve every rank, every rank raises the same CollectiveError.

    >>> comm = col.nccl_communicator()                                # doctest: +SKIP
    """
    return issue(_group(group, "nccl_communicator", timeout), "nccl_communicator", bodies.nccl_communicator,
                 (), False, timeout)


def gpu_transport(*, group: Group | None = None) -> str:
    """How this rank's cupy arrays move on the group: "nccl", "staged (<why not NCCL>)", or "" before
    its first GPU call (``use_local_gpu`` or a collective on a cupy array). Local: no message."""
    made = _group(group, "gpu_transport", None).device_transport
    if made is None:
        return ""
    kind = "nccl" if type(made).__name__ == "NCCLTransport" else "staged"
    return f"{kind} ({made.why_staged})" if made.why_staged else kind


def block_bounds(count: int, size: int | None = None) -> tuple[tuple[int, int], ...]:
    """The ``[start, stop)`` of each rank's block of ``count`` elements, as ``reduce_scatter``
    splits them among ``size`` ranks (default: the world's): like ``np.array_split``, the
    leftover elements go to the first ranks, and a block may be empty.

    >>> block_bounds(10, 3)
    ((0, 4), (4, 7), (7, 10))
    """
    return chunk_bounds(count, startup.size() if size is None else size)


def round_to_wire(x: np.ndarray, compression: str) -> np.ndarray:
    """A new array: ``x`` rounded to the type ``compression`` puts on the wire, and back (what a
    rank receiving ``x`` from ``allreduce(..., compression=compression)`` decodes). Error
    feedback uses it to know, to the bit, what compression takes from a contribution rounded
    before it is sent. The same checks as the all-reduce's: float32, float64 or bfloat16 host data;
    ``compression=None`` rounds nothing (a copy of ``x``).

    >>> round_to_wire(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1e5], np.float32), "bf16")   # ties to even
    array([1.000000e+00, 1.015625e+00, 9.984000e+04], dtype=float32)
    >>> round_to_wire(np.array([0.1, 7e4]), "fp16")                                         # past 65504: inf
    array([0.09997559,        inf])
    """
    x, _, _ = validate.reduction("round_to_wire", x, "sum", None)
    codec = bodies.wire_codec("round_to_wire", compression, x, "sum")
    result = np.array(bodies.widened(x)[0])   # (bfloat16 data: rounded through float32)
    if codec is not None:
        codec.round_(result.reshape(-1))
    return result.astype(x.dtype, copy=False)


def to_host(x) -> np.ndarray:
    """A numpy copy of array ``x`` (a cupy array is copied from its GPU, once the work queued on
    its stream is done; a numpy array is copied too, so the result is always the caller's own).

    >>> to_host(np.arange(3)).tolist()
    [0, 1, 2]
    """
    return arrays.to_host(x)


def synchronize(x) -> None:
    """Wait until the work queued for array ``x`` is done: a GPU call returns with its work queued
    on the current CuPy stream, so time it, or hand ``x`` to the host, after this. Nothing to
    wait for with a numpy array.

    >>> synchronize(np.zeros(3))
    """
    arrays.synchronize(x)
