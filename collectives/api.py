"""The module-level collectives: each is the world's method (``collectives.groups.group.Group``), or,
with ``group=``, that group's. The first call sets the world up (``collectives.process.world.init``).

Also the helpers that programs need beside the calls: where a reduce-scatter's blocks lie
(:func:`block_bounds`), and the two places where host and GPU arrays differ for a caller
(:func:`to_host`, :func:`synchronize`).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from collectives.ops import dispatch
from collectives.process import world as worlds
from collectives.calls.call import issue
from collectives.groups.group import Group, member
from collectives.groups.membership import NonMember
from ring import arrays
from ring.partition import chunk_bounds


def _group(group: object, collective: str, timeout: object) -> Group:
    """``group=`` of a module-level call: the world for None (set up first if need be, within the
    call's ``timeout``), else a group this rank belongs to."""
    world = worlds.world(timeout)
    return world if group is None else member(group, collective, world.runtime)


def _same_as(method: Callable) -> Callable[[Callable], Callable]:
    """Document a module-level function as ``method`` of the world, or of ``group=``."""
    def document(fn: Callable) -> Callable:
        fn.__doc__ = (f"{method.__doc__}\n\n        ``group``: the group to run on (None: the world); the same "
                      f"as ``group.{method.__name__}(...)``.")
        return fn
    return document


@_same_as(Group.allreduce)
def allreduce(x, op: str = "sum", out=None, *, group: Group | None = None, async_op: bool = False,
              timeout: float | None = None, name: str | None = None, algorithm: str | None = None) -> Any:
    g = worlds.the_world if group is None else _group(group, "allreduce", timeout)
    return (g or worlds.world(timeout)).allreduce(x, op, out, async_op=async_op, timeout=timeout, name=name,
                                                   algorithm=algorithm)


@_same_as(Group.allreduce_many)
def allreduce_many(arrays: list, op: str = "sum", *, group: Group | None = None, async_op: bool = False,
                   timeout: float | None = None, name: str | None = None, algorithm: str | None = None) -> Any:
    return _group(group, "allreduce_many", timeout).allreduce_many(arrays, op, async_op=async_op, timeout=timeout,
                                                                   name=name, algorithm=algorithm)


@_same_as(Group.reduce_scatter)
def reduce_scatter(x, op: str = "sum", out=None, *, group: Group | None = None, async_op: bool = False,
                   timeout: float | None = None, name: str | None = None, algorithm: str | None = None) -> Any:
    g = worlds.the_world if group is None else _group(group, "reduce_scatter", timeout)
    return (g or worlds.world(timeout)).reduce_scatter(x, op, out, async_op=async_op, timeout=timeout, name=name,
                                                        algorithm=algorithm)


@_same_as(Group.allgather)
def allgather(x, out=None, *, group: Group | None = None, async_op: bool = False, timeout: float | None = None,
              name: str | None = None, algorithm: str | None = None) -> Any:
    g = worlds.the_world if group is None else _group(group, "allgather", timeout)
    return (g or worlds.world(timeout)).allgather(x, out, async_op=async_op, timeout=timeout, name=name,
                                                   algorithm=algorithm)


@_same_as(Group.broadcast)
def broadcast(x, root: int = 0, *, group: Group | None = None, async_op: bool = False, timeout: float | None = None,
              name: str | None = None, algorithm: str | None = None) -> Any:
    g = worlds.the_world if group is None else _group(group, "broadcast", timeout)
    return (g or worlds.world(timeout)).broadcast(x, root, async_op=async_op, timeout=timeout, name=name,
                                                   algorithm=algorithm)


@_same_as(Group.alltoall)
def alltoall(x, splits=None, out=None, *, out_splits=None, group: Group | None = None, async_op: bool = False,
             timeout: float | None = None, name: str | None = None) -> Any:
    return _group(group, "alltoall", timeout).alltoall(x, splits, out, out_splits=out_splits, async_op=async_op,
                                                       timeout=timeout, name=name)


@_same_as(Group.gather)
def gather(x, root: int = 0, out=None, *, group: Group | None = None, async_op: bool = False,
           timeout: float | None = None, name: str | None = None) -> Any:
    return _group(group, "gather", timeout).gather(x, root, out, async_op=async_op, timeout=timeout, name=name)


@_same_as(Group.scatter)
def scatter(x, root: int = 0, splits=None, out=None, *, group: Group | None = None, async_op: bool = False,
            timeout: float | None = None, name: str | None = None) -> Any:
    return _group(group, "scatter", timeout).scatter(x, root, splits, out, async_op=async_op, timeout=timeout,
                                                     name=name)


@_same_as(Group.reduce)
def reduce(x, op: str = "sum", root: int = 0, out=None, *, group: Group | None = None, async_op: bool = False,
           timeout: float | None = None, name: str | None = None) -> Any:
    return _group(group, "reduce", timeout).reduce(x, op, root, out, async_op=async_op, timeout=timeout, name=name)


@_same_as(Group.barrier)
def barrier(*, group: Group | None = None, async_op: bool = False, timeout: float | None = None,
            name: str | None = None) -> Any:
    g = worlds.the_world if group is None else _group(group, "barrier", timeout)
    return (g or worlds.world(timeout)).barrier(async_op=async_op, timeout=timeout, name=name)


@_same_as(Group.refuse)
def refuse(collective: str, problem: str, *, group: Group | None = None, async_op: bool = False,
           timeout: float | None = None) -> Any:
    return _group(group, collective, timeout).refuse(collective, problem, async_op=async_op, timeout=timeout)


@_same_as(Group.new_group)
def new_group(ranks, *, members_only: bool = False, group: Group | None = None, timeout: float | None = None,
              name: str | None = None) -> Group | NonMember:
    return _group(group, "new_group", timeout).new_group(ranks, members_only=members_only, timeout=timeout,
                                                         name=name)


@_same_as(Group.split)
def split(color: int | None, key: int = 0, *, group: Group | None = None, timeout: float | None = None,
          name: str | None = None) -> Group | NonMember:
    return _group(group, "split", timeout).split(color, key, timeout=timeout, name=name)


@_same_as(Group.destroy)
def destroy(*, group: Group | None = None, timeout: float | None = None, name: str | None = None) -> None:
    return _group(group, "destroy", timeout).destroy(timeout=timeout, name=name)


@_same_as(Group.algorithm_for)
def algorithm_for(collective: str, x, *, group: Group | None = None) -> str:
    return _group(group, "algorithm_for", None).algorithm_for(collective, x)


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
    return issue(worlds.world(timeout), "use_local_gpu", dispatch.use_local_gpu, (), False, timeout)


def nccl_communicator(*, group: Group | None = None, timeout: float | None = None) -> Any:
    """NCCL's own communicator over the group's ranks (``cupy.cuda.nccl.NcclCommunicator``), for a
    program that calls NCCL directly beside the runtime, as ``python -m bench`` does to time NCCL's
    collectives. Every member calls it together, with this rank's GPU current (``use_local_gpu``);
    where NCCL cannot serve every rank, every rank raises the same CollectiveError.

    >>> comm = col.nccl_communicator()                                # doctest: +SKIP
    """
    return issue(_group(group, "nccl_communicator", timeout), "nccl_communicator", dispatch.nccl_communicator,
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
    return chunk_bounds(count, worlds.size() if size is None else size)


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
