"""torch.distributed on the runtime: ``import collectives.torch`` registers the backend "ring".

Under ``mpiexec`` a DDP script needs one word changed::

    import collectives.torch                      # registers "ring"
    dist.init_process_group("ring")               # rank and size from MPI: no MASTER_ADDR/PORT
    model = DistributedDataParallel(model)        # its buckets are all-reduced by the runtime

The process group is an adapter on the public API (``collectives``): it turns tensors into
arrays that share their memory (CPU tensors as numpy arrays, bfloat16 ones as ml_dtypes' bfloat16;
CUDA tensors as CuPy arrays through DLPack), torch's options into the runtime's arguments, and
the runtime's ``Work`` into a torch future, completed by the engine when the call is done, so
that DDP's overlapped buckets run on the runtime's engine. Every collective keeps the runtime's
cross-rank check, timeout and fail-fast: a rank that dies ends every rank's call within the
runtime's timeout (``COLLECTIVES_TIMEOUT``, or torch's ``timeout=`` if shorter), not torch's
30 minutes.

The rendezvous: without MASTER_ADDR, ``env://`` (torch's default) takes rank and size from the
runtime (MPI) and opens no socket; its store refuses every use by name, since nothing here needs
one (a backend that does, like gloo, needs MASTER_ADDR and MASTER_PORT as usual).
"""
from __future__ import annotations

import importlib
import os
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import collectives as col

BACKEND = "ring"
OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
       dist.ReduceOp.PRODUCT: "prod"}


def as_array(t: torch.Tensor) -> Any:
    """The array that shares ``t``'s memory: numpy for a CPU tensor (bfloat16 as ml_dtypes'
    bfloat16), CuPy for a CUDA tensor (through DLPack, on torch's current stream).

    >>> a = as_array(torch.arange(3.0)); a[0] = 7; a.dtype.name
    'float32'
    """
    t = t.detach()
    if t.is_cuda:
        import cupy
        cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream).use()
        return cupy.from_dlpack(t)
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class RingProcessGroup(dist.ProcessGroup):
    """A torch ``ProcessGroup`` whose collectives are the runtime's, on ``group`` (a
    ``collectives.Group``; None: the world). Made by ``init_process_group("ring")`` and ``new_group``."""

    def __init__(self, group: col.Group | None, timeout: float):
        super().__init__(col.rank() if group is None else group.rank(), col.size() if group is None else group.size())
        self.group = group
        self.timeout = timeout

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"<RingProcessGroup {'the world' if self.group is None else self.group!r}>"

    # Reductions.

    def allreduce(self, tensors, opts=None):
        op = _op("all_reduce", opts.reduceOp)
        arrays = [as_array(t) for t in tensors]
        if len(arrays) == 1:
            return self._run(col.allreduce, (arrays[0], op, arrays[0]), tensors)
        return self._run(col.allreduce_many, (arrays, op), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._run(col.allreduce_many, ([as_array(t) for t in tensors], _op("all_reduce", opts.reduceOp)),
                         tensors)

    def reduce(self, tensors, opts=None):
        x = as_array(tensors[0])
        return self._run(col.reduce, (x, _op("reduce", opts.reduceOp), opts.rootRank, x), tensors)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op("reduce_scatter", opts.reduceOp)
        whole = torch.cat([t.reshape(-1) for t in input_lists[0]])
        return self._run(col.reduce_scatter, (as_array(whole), op, _flat(outputs[0])), outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op("reduce_scatter_tensor", opts.reduceOp)
        return self._run(col.reduce_scatter, (_flat(input), op, _flat(output)), [output])

    reduce_scatter_single = _reduce_scatter_base

    # Data movement.

    def broadcast(self, tensors, opts=None):
        return self._run(col.broadcast, (as_array(tensors[0]), opts.rootRank), tensors)

    def allgather(self, output_lists, inputs, opts=None):
        outputs = output_lists[0]
        return self._run(col.allgather, (_flat(inputs[0]),), outputs, _split_into(outputs))

    def _allgather_base(self, output, input, opts=None):
        return self._run(col.allgather, (_flat(input), _flat(output)), [output])

    all_gather_single = _allgather_base

    def alltoall(self, outputs, inputs, opts=None):
        sizes = [t.numel() for t in inputs]
        whole = torch.cat([t.reshape(-1) for t in inputs])
        return self._run(col.alltoall, (as_array(whole), sizes), outputs, _split_into(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        splits = list(input_split_sizes) or None
        return self._run(col.alltoall, (as_array(input), splits, as_array(output)), [output])

    all_to_all_single = alltoall_base

    def gather(self, output_lists, inputs, opts=None):
        outputs = output_lists[0] if output_lists else []
        x = _flat(inputs[0]).reshape(1, -1)
        return self._run(col.gather, (x, opts.rootRank), outputs, _split_into(outputs))

    def scatter(self, outputs, input_lists, opts=None):
        rows = torch.stack([t.reshape(-1) for t in input_lists[0]]) if input_lists else None
        x = None if rows is None else as_array(rows)
        return self._run(col.scatter, (x, opts.rootRank), outputs, _split_into(outputs))

    def barrier(self, opts=None):
        return self._run(col.barrier, (), [])

    # Point to point: the runtime's, on this group's ranks.

    def send(self, tensors, dst: int, tag: int):
        return _PointWork(col.isend(_contiguous("send", tensors[0]), dst, tag, group=self.group), self.timeout)

    def recv(self, tensors, src: int, tag: int):
        return _PointWork(col.irecv(_contiguous("recv", tensors[0]), src, tag, group=self.group), self.timeout)

    def recv_anysource(self, tensors, tag: int):
        return _PointWork(col.irecv(_contiguous("recv", tensors[0]), None, tag, group=self.group), self.timeout)

    def _run(self, method: Callable, args: tuple, tensors: list, after: Callable | None = None):
        """Issue ``method(*args)`` asynchronously; a torch Work whose future completes (with
        ``tensors``) once the runtime's call is done and ``after(result)`` has put its result in place."""
        future: Future = Future()

        def done(work: col.Work) -> None:
            try:
                result = work.wait()
                if after is not None:
                    after(result)
                future.set_result(tensors)
            except BaseException as error:   # noqa: BLE001 - the future carries it to the caller
                future.set_exception(error)

        method(*args, group=self.group, async_op=True, timeout=self.timeout).add_done_callback(done)
        return _create_work_from_future(future)


class _PointWork(dist.Work):
    """A torch Work over a point-to-point request of the runtime."""

    def __init__(self, request: col.Request, timeout: float):
        super().__init__()
        self.request, self.timeout, self.done = request, timeout, False

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.request.wait(self.timeout if timeout is None else timeout.total_seconds())
        self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


def _op(collective: str, op: Any) -> str:
    """torch's reduce op as the runtime names it; the others refused by name."""
    kind = getattr(op, "op", op)
    if kind not in OPS:
        names = ", ".join(str(k).rsplit(".", 1)[-1] for k in OPS)
        raise col.CollectiveUsageError(f"{collective}: op: {str(kind).rsplit('.', 1)[-1]} is not supported by the "
                                       f"ring backend; expected one of {names}")
    return OPS[kind]


def _flat(t: torch.Tensor) -> Any:
    """A 1-D array over contiguous ``t``'s memory."""
    if not t.is_contiguous():
        raise col.CollectiveUsageError(f"tensor: expected a contiguous tensor (as torch's backends do), got strides "
                                       f"{t.stride()} for shape {tuple(t.shape)}")
    return as_array(t).reshape(-1)


def _contiguous(collective: str, t: torch.Tensor) -> np.ndarray:
    if not t.is_contiguous() or t.is_cuda:
        raise col.CollectiveUsageError(f"{collective}: tensor: point-to-point moves contiguous CPU tensors; "
                                       f"got a {'CUDA' if t.is_cuda else 'non-contiguous'} tensor")
    return as_array(t)


def _split_into(outputs: list) -> Callable[[Any], None]:
    """Copy a result (the outputs laid end to end, or None on a rank that gets nothing) into ``outputs``."""
    def copy(result: Any) -> None:
        if result is None:
            return
        flat, start = result.reshape(-1), 0
        for t in outputs:
            as_array(t)[...] = flat[start:start + t.numel()].reshape(t.shape)   # (in t's own memory, any layout)
            start += t.numel()
    return copy


def _create(options, backend_options=None) -> RingProcessGroup:
    """torch's creator for "ring": the world for the default group, a group of its members for
    ``new_group`` (torch calls this on the members alone)."""
    col.init()
    timeout = min(options.timeout.total_seconds(), col.settings().timeout)
    ranks = list(options.global_ranks_in_group)
    if not ranks:
        if (options.group_rank, options.group_size) != (col.rank(), col.size()):
            raise col.CollectiveError(f"init_process_group: torch's rank {options.group_rank} of "
                                      f"{options.group_size} is not MPI's, {col.rank()} of {col.size()}; with the "
                                      "ring backend let MPI set them (leave rank and world_size out)")
        return RingProcessGroup(None, timeout)
    return RingProcessGroup(col.new_group(ranks, members_only=True, timeout=timeout), timeout)


class RefusingStore(dist.Store):
    """The store of the "ring" rendezvous: nothing in the runtime needs one, so every use is
    refused by name rather than left waiting for keys that no other rank can see."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("the ring backend's rendezvous keeps no key-value store (it opens no socket); a backend "
                           "or tool that needs one (gloo, TORCH_DIST_INIT_BARRIER=1) needs MASTER_ADDR and "
                           "MASTER_PORT set, as with torch's own env:// rendezvous")

    set = get = add = compare_set = wait = check = delete_key = num_keys = multi_get = multi_set = _refuse


_rendezvous = importlib.import_module("torch.distributed.rendezvous")   # (the package names a function so too)
_torch_env_handler = _rendezvous._rendezvous_handlers["env"]


def _env_or_runtime(url: str, **kwargs):
    """``env://``: torch's own with MASTER_ADDR set; else rank and size from the runtime (MPI)."""
    if os.environ.get("MASTER_ADDR"):
        yield from _torch_env_handler(url, **kwargs)
        return
    col.init()
    yield RefusingStore(), col.rank(), col.size()
    raise RuntimeError("the ring rendezvous cannot rendezvous again: restart the job")


_rendezvous._rendezvous_handlers["env"] = _env_or_runtime   # (register_rendezvous_handler refuses a second "env")
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
