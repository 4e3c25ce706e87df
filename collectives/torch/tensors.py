"""torch tensors as the runtime's arrays, and what the ring backend checks that the runtime cannot.

Every check here returns nothing or raises ``CollectiveUsageError``; the process group turns
that into a refusal every rank hears of (``col.refuse``), so a rank with a wrong tensor list
does not leave the others waiting.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import collectives as col
from collectives.calls.validate import is_bfloat16

OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
       dist.ReduceOp.PRODUCT: "prod"}
#: A bool tensor is reduced as gloo reduces it: sum and max are "any", prod and min "all".
BOOL_OPS = {"sum": "max", "max": "max", "prod": "min", "min": "min"}


def as_array(t: torch.Tensor) -> Any:
    """The array that shares ``t``'s memory: numpy for a CPU tensor (bfloat16 as ml_dtypes'
    bfloat16, bool as uint8), CuPy for a CUDA tensor (through DLPack, on torch's current stream).

    >>> a = as_array(torch.arange(3.0)); a[0] = 7; a.dtype.name
    'float32'
    """
    if t.requires_grad:
        t = t.detach()
    if t.is_cuda:
        import cupy
        cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream).use()
        return cupy.from_dlpack(t)
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return _shared(t.view(torch.int16)).view(ml_dtypes.bfloat16)
    if t.dtype == torch.bool:
        return _shared(t.view(torch.uint8))
    return _shared(t)


class _Memory:
    """A CPU tensor's memory as numpy's array interface describes it. The array numpy makes of it
    holds it, and so the tensor, alive. Not ``Tensor.numpy()``: that marks the tensor's storage
    not resizable for good, and torch code resizes tensors a collective went through (gloo leaves
    them resizable): batched_powerSGD_hook pads DDP's bucket with ``resize_``."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        strides = None   # (numpy's for C order: a contiguous tensor's, without a generator a call)
        if not t.is_contiguous():
            size = t.element_size()
            strides = tuple(s * size for s in t.stride())
        self.__array_interface__ = {"version": 3, "shape": tuple(t.shape), "typestr": _typestr(t.dtype),
                                    "data": (t.data_ptr(), False), "strides": strides}


@functools.cache
def _typestr(dtype: torch.dtype) -> str:
    return torch.empty(0, dtype=dtype).numpy().dtype.str   # (a tensor of its own: nobody resizes it)


def _shared(t: torch.Tensor) -> np.ndarray:
    """The numpy array over CPU tensor ``t``'s memory (its strides too), writable; ``t`` stays resizable.

    >>> t = torch.zeros(2); _shared(t)[1] = 5; t.resize_(3)[:2].tolist()
    [0.0, 5.0]
    """
    if t.is_conj() or t.is_neg():   # (lazy bits an array cannot carry: refused, as Tensor.numpy() refuses them)
        raise ValueError("its conjugate or negative bit is set; call resolve_conj() or resolve_neg() first")
    return np.asarray(_Memory(t))


def flat(t: torch.Tensor) -> Any:
    """A 1-D array over contiguous ``t``'s memory (a complex tensor's as pairs of floats)."""
    return as_array(torch.view_as_real(t) if t.is_complex() else t).reshape(-1)


def reduction(collective: str, t: torch.Tensor, op: Any) -> tuple[Any, str]:
    """``t`` (contiguous) as an array, and torch's reduce ``op`` as the runtime names it for that
    array: a bool tensor as bytes (see BOOL_OPS), a complex one as pairs of floats (SUM and AVG,
    as gloo); the bitwise ops, AVG of bools and the ordering ops of complex numbers refused by name.

    >>> reduction("all_reduce", torch.tensor([True]), dist.ReduceOp.SUM)[1]
    'max'
    >>> reduction("reduce", torch.ones(2, dtype=torch.complex64), dist.ReduceOp.SUM)[0].shape
    (2, 2)
    """
    kind = getattr(op, "op", op)
    name = OPS.get(kind)   # (one lookup: torch's op hashes slowly, 0.5 us)
    if name is None:
        names = ", ".join(str(k).rsplit(".", 1)[-1] for k in OPS)
        raise col.CollectiveUsageError(f"{collective}: op: {str(kind).rsplit('.', 1)[-1]} is not supported by the "
                                       f"ring backend; expected one of {names}")
    if name == "avg" and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):   # (named here in
        raise col.CollectiveUsageError(f"{collective}: op: AVG of a {t.dtype} tensor has no result of its dtype; "
                                       "use SUM and divide, or a floating-point tensor")   # torch's words, not the runtime's)
    if t.is_complex():
        if name not in ("sum", "avg"):
            raise col.CollectiveUsageError(f"{collective}: op: {name.upper()} has no meaning for complex numbers; "
                                           "expected SUM or AVG")
        return as_array(torch.view_as_real(t)), name
    if t.dtype != torch.bool:
        return as_array(t), name
    if name not in BOOL_OPS:
        raise col.CollectiveUsageError(f"{collective}: op: AVG of a bool tensor has no bool result (gloo refuses it "
                                       "too); convert the tensor to a floating-point dtype first")
    return as_array(t), BOOL_OPS[name]


def wire_type(x: Any, op: str) -> str | None:
    """The ``compression=`` of an all-reduce of array ``x`` by ``op``: "bf16" for a bfloat16 host
    array summed or averaged, else None. The runtime reduces bfloat16 through float32, and without
    it that float32 is what crosses the wire, twice the bytes of the tensor (bf16_compress_hook
    would save nothing); with it each hop rounds its partial sum to bfloat16 to send it on, as gloo
    rounds after each addition. Small calls (recursive doubling) still move float32.

    >>> wire_type(as_array(torch.ones(2, dtype=torch.bfloat16)), "sum"), wire_type(as_array(torch.ones(2)), "sum")
    ('bf16', None)
    """
    return "bf16" if isinstance(x, np.ndarray) and is_bfloat16(x.dtype) and op in ("sum", "avg") else None


def sparse_rows(t: torch.Tensor) -> np.ndarray:
    """A sparse COO tensor's entries as rows of bytes (its indices, then its values), to be
    gathered from every rank and summed by :func:`sparse_sum`: a sparse all-reduce as gloo's
    (every rank's entries, then one coalesce).

    >>> sparse_rows(torch.eye(2).to_sparse()).shape        # 2 entries: 2 int64 indices + 1 float32
    (2, 20)
    """
    c = t.coalesce()
    indices = c.indices().t().contiguous().numpy()
    values = c.values().contiguous().numpy().reshape(len(indices), -1)
    return np.concatenate([indices.view(np.uint8), values.view(np.uint8)], axis=1)


def sparse_sum(rows: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The sum of the entries ``rows`` holds (as :func:`sparse_rows` packs them), shaped as ``like``.

    >>> sparse_sum(np.concatenate([sparse_rows(torch.eye(2).to_sparse())] * 2), torch.eye(2).to_sparse()).to_dense()
    tensor([[2., 0.],
            [0., 2.]])
    """
    sparse_dim = like.sparse_dim()
    index_bytes = 8 * sparse_dim
    indices = np.ascontiguousarray(rows[:, :index_bytes]).view(np.int64).reshape(-1, sparse_dim)
    values = np.ascontiguousarray(rows[:, index_bytes:]).view(torch.empty(0, dtype=like.dtype).numpy().dtype)
    values = values.reshape((len(indices),) + tuple(like.shape[sparse_dim:]))
    return torch.sparse_coo_tensor(torch.from_numpy(indices).t(), torch.from_numpy(values), like.shape).coalesce()


#: The dtypes whose tensors become arrays (``as_array``); float8, quantized and bit types do not.
CARRIED_DTYPES = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                            torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
                            torch.float32, torch.float64, torch.complex64, torch.complex128))


def dense(collective: str, tensors: list, argument: str = "tensor") -> None:
    """Refuse by name what the ring cannot move: sparse (and other non-strided) tensors, devices
    other than the CPU and CUDA, dtypes with no array of their own (float8, quantized).

    >>> dense("all_reduce", [torch.ones(2, device="meta")])
    Traceback (most recent call last):
    collectives.errors.CollectiveUsageError: all_reduce: tensor: a tensor on meta; the ring backend moves CPU and CUDA tensors
    """
    for t in tensors:
        if t.layout != torch.strided:
            raise col.CollectiveUsageError(f"{collective}: {argument}: {t.layout} tensors are not supported by the "
                                           "ring backend (it moves dense arrays); call .to_dense() first")
        if t.device.type not in ("cpu", "cuda"):
            raise col.CollectiveUsageError(f"{collective}: {argument}: a tensor on {t.device}; the ring backend "
                                           "moves CPU and CUDA tensors")
        if t.dtype not in CARRIED_DTYPES:
            raise col.CollectiveUsageError(f"{collective}: {argument}: {t.dtype} is not supported by the ring "
                                           "backend (dequantize, or convert to a float type, first)")


def same_sizes(collective: str, tensors: list, numel: int, count: int, argument: str,
               dtype: torch.dtype | None = None) -> None:
    """Refuse a list of tensors that is not ``count`` tensors of ``numel`` elements (and ``dtype``) each."""
    if len(tensors) != count:
        raise col.CollectiveUsageError(f"{collective}: {argument}: expected {count} tensors (one per rank), "
                                       f"got {len(tensors)}")
    for i, t in enumerate(tensors):
        if t.numel() != numel:
            raise col.CollectiveUsageError(f"{collective}: {argument}: tensor {i} has {t.numel()} elements "
                                           f"(shape {tuple(t.shape)}); expected {numel}, as the input has")
        if dtype is not None and t.dtype != dtype:
            raise col.CollectiveUsageError(f"{collective}: {argument}: tensor {i} is {t.dtype}; expected {dtype}, "
                                           "as the input is")


def staged(collective: str, t: torch.Tensor, argument: str, written: bool) -> tuple[torch.Tensor, Any]:
    """``t`` itself if contiguous, else a contiguous copy and, where the call writes ``t``, what
    writes the copy back once it is done (gloo takes non-contiguous tensors too). A tensor to be
    written whose elements share memory (an expanded or stride-0 view) is refused: the result
    has nowhere to go.

    >>> staged("broadcast", torch.ones(3).expand(2, 3), "tensor", written=False)[0].is_contiguous()
    True
    """
    if t.is_contiguous():
        return t, None
    if written:
        holds_a_result(collective, argument, t)
    copy = t.contiguous()
    return copy, (lambda _: t.copy_(copy)) if written else None


def holds_a_result(collective: str, argument: str, t: torch.Tensor) -> None:
    """Refuse ``t`` as a destination if its elements share memory (an expanded or stride-0 view): the
    result would have nowhere to go."""
    if not t.is_contiguous() and torch._debug_has_internal_overlap(t) == 1:
        raise col.CollectiveUsageError(f"{collective}: {argument}: its elements share memory (an expanded or "
                                       f"stride-0 view, strides {t.stride()}), so it cannot hold a result; pass "
                                       "a tensor of its own (t.clone())")


def into(outputs: list, collective: str, argument: str) -> Callable[[Any], None]:
    """What copies a result (the outputs laid end to end, or None on a rank that gets nothing)
    into the tensors ``outputs`` (argument ``argument`` of ``collective``), each in its own memory,
    any layout; refused now if one cannot hold its part (:func:`holds_a_result`)."""
    for i, t in enumerate(outputs):
        holds_a_result(collective, f"{argument}[{i}]", t)

    def copy(result: Any) -> None:
        if result is None:
            return
        whole, start = result.reshape(-1), 0
        for t in outputs:
            as_array(t)[...] = whole[start:start + t.numel()].reshape(t.shape)
            start += t.numel()
    return copy


def rows_of(tensors: list) -> torch.Tensor:
    """Equal-sized tensors as the rows of one 2-D tensor: a view, without a copy, where they lie
    end to end in one memory (``list(t.chunk(n))``, ``t.unbind()``), else a new stacked tensor
    (a copy of every element: at 64 MiB most of a scatter's time).

    >>> t = torch.arange(6.0); rows_of(list(t.chunk(3))).data_ptr() == t.data_ptr()
    True
    """
    first, size = tensors[0], tensors[0].numel()
    if all(t.is_contiguous() and t.dtype == first.dtype and t.device == first.device and t.numel() == size
           and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
           and t.storage_offset() == first.storage_offset() + i * size for i, t in enumerate(tensors)):
        return first.as_strided((len(tensors), size), (size, 1))
    return torch.stack([t.reshape(-1) for t in tensors])


def padded_blocks(tensors: list) -> torch.Tensor:
    """Tensors of different sizes as the equal rows of one 2-D tensor, each zero-padded to the
    longest (the ring's blocks are equal; an uneven reduce_scatter list travels so):

        [a0 a1 a2], [b0], [c0 c1]  ->  [[a0 a1 a2], [b0 0 0], [c0 c1 0]]

    >>> padded_blocks([torch.tensor([1., 2.]), torch.tensor([3.])]).tolist()
    [[1.0, 2.0], [3.0, 0.0]]
    """
    first = tensors[0]
    blocks = torch.zeros(len(tensors), max(t.numel() for t in tensors), dtype=first.dtype, device=first.device)
    for row, t in zip(blocks, tensors):
        row[:t.numel()] = t.reshape(-1)
    return blocks


def copied_into(out: torch.Tensor, received: torch.Tensor,
                back: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """What puts the head of ``received`` (where the runtime wrote: a padded block, a host tensor
    for a CUDA ``out``) into ``out`` once the call is done, then writes a staged copy back."""
    def copy(_: Any) -> None:
        out.copy_(received.reshape(-1)[:out.numel()].reshape(out.shape))
        if back is not None:
            back(None)
    return copy


def joined(tensors: list) -> torch.Tensor:
    """The tensors' elements end to end, in one new contiguous tensor."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def host_array(collective: str, t: torch.Tensor) -> np.ndarray:
    """The numpy array of a CPU tensor that point-to-point can move (contiguous); others refused."""
    if not t.is_contiguous() or t.is_cuda:
        raise col.CollectiveUsageError(f"{collective}: tensor: point-to-point moves contiguous CPU tensors; "
                                       f"got a {'CUDA' if t.is_cuda else 'non-contiguous'} tensor")
    return as_array(t)


def same_dtype(collective: str, tensors: list, argument: str) -> None:
    """Refuse tensors whose dtypes differ (gloo does too)."""
    if len({t.dtype for t in tensors}) > 1:
        raise col.CollectiveUsageError(f"{collective}: {argument}: the tensors' dtypes differ "
                                       f"({', '.join(sorted({str(t.dtype) for t in tensors}))}); gloo refuses "
                                       "that too")
