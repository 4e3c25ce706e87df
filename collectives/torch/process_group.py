"""The ring backend's torch ``ProcessGroup``: torch's calls as the runtime's, on one group.

Each method turns torch's tensors and options into the runtime's arrays and arguments
(``prepare``), checks what the runtime cannot see (the sizes in torch's tensor lists), and
hands the call to :meth:`RingProcessGroup._run`:

* a synchronous call (``async_op=False``: torch waits at once) runs in the caller's thread,
  as ``col.allreduce(x)`` does: no engine thread, no future;
* an asynchronous one (``async_op=True``, DDP's buckets) runs on the runtime's engine and
  returns a :class:`~collectives.torch.work.RingWork`;
* a local refusal becomes ``col.refuse``: every rank raises the same error in that call.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

import collectives as col
from collectives.torch.tensors import (OPS, as_array, copied_into, dense, flat, host_array, into, joined,
                                       padded_blocks, reduction, rows_of, same_dtype, same_sizes, sparse_rows,
                                       sparse_sum, staged, wire_type)
from collectives.torch.work import RingBackendError, RingWork, for_torch

BACKEND = "ring"
Prepared = tuple[Callable, tuple, list, Callable[[Any], None] | None]   # (collective, its arguments, tensors, after)


class RingProcessGroup(dist.ProcessGroup):
    """A torch ``ProcessGroup`` whose collectives are the runtime's, on ``group`` (a
    ``collectives.Group``; None: the world as it is now). Made by ``init_process_group("ring")`` and
    ``new_group``; ``timeout`` (seconds; None: the runtime's ``COLLECTIVES_TIMEOUT``) bounds each call.
    After a change of the world (``collectives.elastic``) its calls raise, as its group's do
    (``MembershipChanged``): destroy it and make the process group again on the new world.

    >>> pg = dist.new_group(backend="ring")                       # doctest: +SKIP
    >>> pg.allreduce([torch.ones(3)]).wait()                      # doctest: +SKIP
    True
    """

    def __init__(self, group: col.Group | None, timeout: float | None):
        group = col.world_group() if group is None else group   # (held, not None: the world changes, this one not)
        super().__init__(group.rank(), group.size())
        self.group = group
        self.timeout = timeout
        self._name = self._description = ""   # (set by torch; its own ProcessGroup keeps them on backends)

    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._description

    def setGroupDesc(self, description: str) -> None:
        self._description = description

    def __repr__(self) -> str:
        return f"<RingProcessGroup {self.group!r}>"

    # Reductions.

    def allreduce(self, tensors: list, opts=None) -> RingWork:
        opts = opts or c10d.AllreduceOptions()

        def prepare() -> Prepared:
            if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo:
                return self._sparse_sum(tensors[0], opts.reduceOp)
            t, back = self._one("all_reduce", tensors)
            x, op = reduction("all_reduce", t, opts.reduceOp)
            return functools.partial(col.allreduce, compression=wire_type(x, op)), (x, op, x), tensors, back
        return self._run("allreduce", opts, prepare)

    def _sparse_sum(self, t: torch.Tensor, op: Any) -> Prepared:
        """A sparse all-reduce, as gloo's: every rank's entries gathered, then summed (SUM only).
        The entries travel as bytes, so their dtype and shape ride in the call's ``name=``, which
        the cross-rank check compares."""
        if OPS.get(getattr(op, "op", op)) != "sum":
            raise col.CollectiveUsageError("all_reduce: op: a sparse tensor is reduced by SUM only (as gloo's)")
        gathered = functools.partial(col.allgather, name=f"sparse {str(t.dtype)[6:]} {list(t.shape)}")
        return gathered, (sparse_rows(t),), [t], lambda rows: t.copy_(sparse_sum(rows, t))

    def allreduce_coalesced(self, tensors: list, opts=None) -> RingWork:
        opts = opts or c10d.AllreduceCoalescedOptions()

        def prepare() -> Prepared:
            dense("all_reduce_coalesced", tensors, "tensors")
            same_dtype("all_reduce_coalesced", tensors, "tensors")
            copies = [staged("all_reduce_coalesced", t, "tensors", written=True) for t in tensors]
            pairs = [reduction("all_reduce_coalesced", t, opts.reduceOp) for t, _ in copies]
            arrays, op = [x for x, _ in pairs], pairs[0][1] if pairs else "sum"
            many = functools.partial(col.allreduce_many, compression=wire_type(arrays[0], op) if arrays else None)
            return many, (arrays, op), tensors, _all(b for _, b in copies)
        return self._run("allreduce_many", opts, prepare)

    def reduce(self, tensors: list, opts=None) -> RingWork:
        opts = opts or c10d.ReduceOptions()

        def prepare() -> Prepared:
            t, back = self._one("reduce", tensors)
            x, op = reduction("reduce", t, opts.reduceOp)
            return col.reduce, (x, op, opts.rootRank, x), tensors, back
        return self._run("reduce", opts, prepare)

    def reduce_scatter(self, outputs: list, input_lists: list, opts=None) -> RingWork:
        opts = opts or c10d.ReduceScatterOptions()

        def prepare() -> Prepared:
            out, back = self._one("reduce_scatter", outputs, "output")
            pieces = input_lists[0] if len(input_lists) == 1 else []
            if len(pieces) == self.size() and pieces[self.rank()].numel() == out.numel() \
                    and any(t.numel() != out.numel() for t in pieces):
                return self._uneven_reduce_scatter(pieces, out, back, outputs, opts.reduceOp)
            same_sizes("reduce_scatter", pieces, out.numel(), self.size(), "input_list", out.dtype)
            dense("reduce_scatter", pieces, "input_list")
            x, op = reduction("reduce_scatter", joined(pieces), opts.reduceOp)
            return col.reduce_scatter, (x, op, flat(out)), outputs, back
        return self._run("reduce_scatter", opts, prepare)

    def _uneven_reduce_scatter(self, pieces: list, out: torch.Tensor, back: Any, outputs: list, op: Any) -> Prepared:
        """A reduce_scatter whose input list holds tensors of different sizes (rank j's output has
        tensor j's elements), as gloo takes it: in equal zero-padded blocks (``padded_blocks``),
        rank j keeping the head of block j. Every rank must pass the same sizes; the padded
        total is what the ranks compare."""
        same_dtype("reduce_scatter", pieces + [out], "input_list")
        dense("reduce_scatter", pieces, "input_list")
        blocks = padded_blocks(pieces)
        x, op = reduction("reduce_scatter", blocks.reshape(-1), op)
        block = torch.empty(blocks.shape[1], dtype=out.dtype, device=out.device)
        return col.reduce_scatter, (x, op, flat(block)), outputs, copied_into(out, block, back)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> RingWork:
        opts = opts or c10d.ReduceScatterOptions()

        def prepare() -> Prepared:
            out, back = self._one("reduce_scatter_tensor", [output], "output")
            whole = self._whole("reduce_scatter_tensor", input, out, "input")
            x, op = reduction("reduce_scatter_tensor", whole, opts.reduceOp)
            return col.reduce_scatter, (x.reshape(-1), op, flat(out)), [output], back
        return self._run("reduce_scatter", opts, prepare)

    reduce_scatter_single = _reduce_scatter_base   # (the name torch's reduce_scatter_tensor calls)

    # Data movement.

    def broadcast(self, tensors: list, opts=None) -> RingWork:
        opts = opts or c10d.BroadcastOptions()

        def prepare() -> Prepared:
            t, back = self._one("broadcast", tensors)
            return col.broadcast, (as_array(t), opts.rootRank), tensors, back
        return self._run("broadcast", opts, prepare)

    def allgather(self, output_lists: list, inputs: list, opts=None) -> RingWork:
        opts = opts or c10d.AllgatherOptions()

        def prepare() -> Prepared:
            x, _ = self._one("all_gather", inputs, written=False)
            outputs = output_lists[0] if len(output_lists) == 1 else []
            same_sizes("all_gather", outputs, x.numel(), self.size(), "tensor_list", x.dtype)
            return col.allgather, (flat(x).reshape(1, -1),), outputs, into(outputs, "all_gather", "tensor_list")
        return self._run("allgather", opts, prepare)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> RingWork:
        opts = opts or c10d.AllgatherOptions()

        def prepare() -> Prepared:
            x, _ = self._one("all_gather_into_tensor", [input], written=False)
            out, back = self._one("all_gather_into_tensor", [output], "output_tensor")
            self._whole("all_gather_into_tensor", out, x, "output_tensor")
            return col.allgather, (flat(x).reshape(1, -1), flat(out).reshape(self.size(), -1)), [output], back
        return self._run("allgather", opts, prepare)

    all_gather_single = _allgather_base   # (the name torch's all_gather_into_tensor calls)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts=None) -> RingWork:
        opts = opts or c10d.AllgatherOptions()

        def prepare() -> Prepared:
            dense("all_gather_coalesced", inputs, "input_tensor_list")
            same_dtype("all_gather_coalesced", inputs, "input_tensor_list")
            if len(output_lists) != self.size():
                raise col.CollectiveUsageError(f"all_gather_coalesced: output_tensor_lists: expected {self.size()} "
                                               f"lists (one per rank), got {len(output_lists)}")
            for outputs in output_lists:   # (each rank's list: one tensor like each input)
                if [(t.numel(), t.dtype) for t in outputs] != [(t.numel(), t.dtype) for t in inputs]:
                    raise col.CollectiveUsageError("all_gather_coalesced: output_tensor_lists: each list must hold "
                                                   "one tensor of each input's size and dtype, in order")
            by_rank = [t for outputs in output_lists for t in outputs]
            whole = joined(inputs)
            return col.allgather, (as_array(whole).reshape(1, -1),), by_rank, into(by_rank, "all_gather_coalesced",
                                                                                 "output_tensor_lists")
        return self._run("allgather", opts, prepare)

    def alltoall(self, outputs: list, inputs: list, opts=None) -> RingWork:
        opts = opts or c10d.AllToAllOptions()

        def prepare() -> Prepared:
            for name, tensors in (("input_tensor_list", inputs), ("output_tensor_list", outputs)):
                dense("all_to_all", tensors, name)
                if len(tensors) != self.size():
                    raise col.CollectiveUsageError(f"all_to_all: {name}: expected {self.size()} tensors (one per "
                                                   f"rank), got {len(tensors)}")
            same_dtype("all_to_all", inputs + outputs, "tensors")
            sizes, wanted = [t.numel() for t in inputs], [t.numel() for t in outputs]
            alltoall = functools.partial(col.alltoall, out_splits=wanted)
            copy = into(outputs, "all_to_all", "output_tensor_list")
            return alltoall, (as_array(joined(inputs)), sizes), outputs, copy
        return self._run("alltoall", opts, prepare)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,
                      input_split_sizes: list, opts=None) -> RingWork:
        opts = opts or c10d.AllToAllOptions()

        def prepare() -> Prepared:
            x, _ = self._one("all_to_all_single", [input], written=False)
            out, back = self._one("all_to_all_single", [output], "output")
            same_dtype("all_to_all_single", [x, out], "output")
            if x.dim() == 0 or out.dim() == 0:
                raise col.CollectiveUsageError("all_to_all_single: input: 0-d tensors have no dim 0 to split")
            rows = as_array(x).reshape(x.shape[0], math.prod(x.shape[1:]))   # (0 rows too: no -1)
            out_rows = flat(out).reshape(out.shape[0], math.prod(out.shape[1:]))
            alltoall = functools.partial(col.alltoall, out_splits=list(output_split_sizes) or None)
            return alltoall, (rows, list(input_split_sizes) or None, out_rows), [output], back
        return self._run("alltoall", opts, prepare)

    all_to_all_single = alltoall_base   # (the name torch's all_to_all_single calls)

    def gather(self, output_lists: list, inputs: list, opts=None) -> RingWork:
        opts = opts or c10d.GatherOptions()

        def prepare() -> Prepared:
            x, _ = self._one("gather", inputs, written=False)
            outputs = output_lists[0] if len(output_lists) == 1 else []
            if self.rank() == opts.rootRank:
                same_sizes("gather", outputs, x.numel(), self.size(), "gather_list", x.dtype)
            elif output_lists and any(output_lists):
                raise col.CollectiveUsageError("gather: gather_list: must be empty on every rank but the root")
            return col.gather, (flat(x).reshape(1, -1), opts.rootRank), outputs, into(outputs, "gather", "gather_list")
        return self._run("gather", opts, prepare)

    def scatter(self, outputs: list, input_lists: list, opts=None) -> RingWork:
        opts = opts or c10d.ScatterOptions()

        def prepare() -> Prepared:
            out, back = self._one("scatter", outputs, "output")
            pieces = input_lists[0] if len(input_lists) == 1 else []
            if self.rank() == opts.rootRank:
                same_sizes("scatter", pieces, out.numel(), self.size(), "scatter_list", out.dtype)
                dense("scatter", pieces, "scatter_list")
            elif input_lists and any(input_lists):
                raise col.CollectiveUsageError("scatter: scatter_list: must be empty on every rank but the root")
            rows = as_array(rows_of(pieces)) if pieces else None
            # (out's elements and dtype are compared across ranks by the call's own check; a scatter
            # moves through host memory, so a CUDA out receives in a host tensor first)
            host = torch.empty(out.shape, dtype=out.dtype) if out.is_cuda else out
            after = copied_into(out, host, back) if out.is_cuda else back
            return col.scatter, (rows, opts.rootRank, None, flat(host).reshape(1, -1)), outputs, after
        return self._run("scatter", opts, prepare)

    def barrier(self, opts=None) -> RingWork:
        return self._run("barrier", opts or c10d.BarrierOptions(), lambda: (col.barrier, (), [], None))

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive within ``timeout`` (default: this
        group's), as gloo's does; the runtime's roll call finds them on every rank that came.
        A timeout of 0 has run out before anyone could arrive."""
        seconds = (self.timeout or col.settings().timeout) if timeout is None else timeout.total_seconds()
        if seconds <= 0:
            raise RingBackendError(f"Rank {self.rank()} timed out in monitoredBarrier: its timeout is {seconds:g} s")
        try:
            col.barrier(group=self.group, timeout=seconds, name="monitored_barrier")
        except col.CollectiveError as error:
            raise RingBackendError(f"Rank {self.rank()} timed out in monitoredBarrier after {seconds:g} s: {error}") \
                from error

    # Point to point: the runtime's, on this group's ranks.

    def send(self, tensors: list, dst: int, tag: int) -> RingWork:
        return self._point("send", col.isend, tensors, dst, tag)

    def recv(self, tensors: list, src: int, tag: int) -> RingWork:
        return self._point("recv", col.irecv, tensors, src, tag)

    def recv_anysource(self, tensors: list, tag: int) -> RingWork:
        return self._point("recv", col.irecv, tensors, None, tag)

    def _point(self, what: str, post: Callable, tensors: list, peer: int | None, tag: int) -> RingWork:
        """Post a point-to-point call; what it raises at once is raised as torch expects it."""
        try:
            request = post(host_array(what, tensors[0]), peer, tag, group=self.group)
        except (col.CollectiveUsageError, col.CollectiveError) as error:
            raise for_torch(error) from error
        return RingWork(request, tensors, bound=self.timeout)

    # The one way every collective runs.

    def _run(self, collective: str, opts: Any, prepare: Callable[[], Prepared]) -> RingWork:
        """Run the call ``prepare()`` describes: in this thread if torch waits at once (as a
        blocking ``col`` call, no future), else on the runtime's engine; a refusal every rank hears."""
        try:
            method, args, tensors, after = prepare()
        except col.CollectiveUsageError as refused:
            method, args, tensors, after = col.refuse, (collective, str(refused)), [], None
        except Exception as error:   # noqa: BLE001 - whatever torch raised here, the others must hear of it
            problem = f"{collective}: tensor: {type(error).__name__}: {error}"
            method, args, tensors, after = col.refuse, (collective, problem), [], None
        if getattr(opts, "asyncOp", True):
            try:
                return RingWork(method(*args, group=self.group, async_op=True, timeout=self.timeout), tensors, after)
            except col.CollectiveError as error:   # (a stopped runtime, a world that changed: raised at once)
                raise for_torch(error) from error
        try:
            result = method(*args, group=self.group, timeout=self.timeout)
            if after is not None:
                after(result)
        except Exception as error:   # noqa: BLE001 - raised by wait(), where torch looks for it
            return RingWork.done(tensors, error)
        return RingWork.done(tensors)

    def _one(self, collective: str, tensors: list, argument: str = "tensor",
             written: bool = True) -> tuple[torch.Tensor, Any]:
        """The one dense tensor of a call, contiguous (a copy if need be), and, where the call
        writes it, what writes a copy back once the call is done (None: nothing to write back)."""
        if len(tensors) != 1:
            raise col.CollectiveUsageError(f"{collective}: {argument}: expected one tensor (the ring backend drives "
                                           f"one device per rank), got {len(tensors)}")
        dense(collective, tensors, argument)
        return staged(collective, tensors[0], argument, written)

    def _whole(self, collective: str, whole: torch.Tensor, block: torch.Tensor, argument: str) -> torch.Tensor:
        """``whole``, refused unless it holds size() blocks of ``block``'s elements and dtype."""
        if whole.numel() != self.size() * block.numel() or whole.dtype != block.dtype:
            raise col.CollectiveUsageError(f"{collective}: {argument}: expected {self.size()} x {block.numel()} "
                                           f"elements of {block.dtype} (size() blocks), got {whole.numel()} of "
                                           f"{whole.dtype}")
        return whole


def _all(backs) -> Callable[[Any], None] | None:
    """One ``after`` that writes back every staged copy."""
    pending = [b for b in backs if b is not None]
    return (lambda result: [b(result) for b in pending]) if pending else None
