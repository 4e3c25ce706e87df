"""Argument checks shared by every collective. Each raises CollectiveUsageError naming
the collective and the argument, and none of them touches a buffer."""
from __future__ import annotations

import numbers
import threading
from typing import Any

import numpy as np

from collectives.errors import CollectiveUsageError
from ring import arrays

OPS = ("sum", "avg", "min", "max", "prod")
REDUCIBLE_DTYPES = tuple(np.dtype(t) for t in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"))
_REDUCIBLE = frozenset(REDUCIBLE_DTYPES)
#: What a scatter's header can name (index in this tuple; -1: ml_dtypes' bfloat16, see header_dtype).
HEADER_DTYPES = REDUCIBLE_DTYPES + tuple(np.dtype(t) for t in ("bool", "complex64", "complex128"))
_ACCEPTED = frozenset((d, op) for d in REDUCIBLE_DTYPES for op in OPS if not (op == "avg" and d.kind in "iu"))


def fail(collective: str, argument: str, problem: str):
    raise CollectiveUsageError(f"{collective}: {argument}: {problem}")


def reduction(collective: str, x: Any, op: Any, out: Any, shape: tuple | None = None) -> tuple[Any, Any, bool]:
    """``x`` and ``out`` as :func:`plain` makes them, checked for a reduction by ``op`` whose result
    has ``shape`` (default: x's), and whether ``out`` is ``x`` itself (in place).

    The common case (plain host arrays of a reducible dtype, ``out`` None, ``x`` itself, or an
    array of its own of the right shape) is decided here in a few tests without a call: this
    runs on every reduction. Anything else takes the full checks, which name what is wrong."""
    if type(x) is np.ndarray and type(op) is str and (x.dtype, op) in _ACCEPTED:
        if out is None:
            return x, out, False
        if out is x and shape is None:
            flags = x.flags
            if flags.writeable and flags.c_contiguous:
                return x, out, True
        if (type(out) is np.ndarray and out.dtype == x.dtype and out.shape == (x.shape if shape is None else shape)
                and out.flags.writeable and out.flags.owndata and x.flags.owndata):
            return x, out, False   # two arrays that own their memory never overlap
    x, out = plain(collective, "x", x), plain(collective, "out", out)
    reducible(collective, "x", x, op)
    in_place = out is not None and out_array(collective, out, x, x.shape if shape is None else shape)
    return x, out, in_place


def gathered(collective: str, x: Any, out: Any) -> tuple[Any, Any]:
    """``x`` and ``out`` of an all-gather as :func:`plain` makes them, checked: ``x`` an array of
    at least one dimension, ``out`` None or an array whose trailing shape and dtype are x's, apart
    from x (axis 0, the ranks' rows together, is checked by the call itself). The common case is
    decided without a call, as in :func:`reduction`."""
    if type(x) is np.ndarray and x.ndim and not x.dtype.hasobject and (out is None or (
            type(out) is np.ndarray and out is not x and out.ndim == x.ndim and out.dtype == x.dtype
            and out.shape[1:] == x.shape[1:] and out.flags.writeable and out.flags.owndata and x.flags.owndata)):
        return x, out
    x, out = plain(collective, "x", x), plain(collective, "out", out)
    array(collective, "x", x)
    if x.ndim == 0:
        fail(collective, "x", f"is 0-dimensional; {collective} moves rows along axis 0 (pass x.reshape(1))")
    if out is not None:
        if not arrays.is_array(out):
            fail(collective, "out", f"expected None or a numpy.ndarray (or a cupy.ndarray) like x, got "
                                    f"{type(out).__name__}")
        if out.ndim != x.ndim:
            fail(collective, "out", f"expected {x.ndim} dimension(s) like x, got {out.ndim}")
        if out.shape[1:] != x.shape[1:]:   # (out_array would name a result's shape that axis 0 does not know yet)
            fail(collective, "out", f"shape {out.shape}: its shape past axis 0 must be x's, {x.shape[1:]} (axis 0: "
                                    "the rows of every rank together)")
        if out_array(collective, out, x, out.shape, in_place=False):   # (its axis 0: checked by the call)
            fail(collective, "out", "is x itself; the result must go elsewhere")
    return x, out


def broadcast(collective: str, x: Any, root: Any, size: int, world: bool, me: int) -> tuple[Any, int]:
    """``x`` (as :func:`plain` makes it) and ``root`` of a broadcast by rank ``me`` of ``size``:
    an array, a rank of the world (or group), writable where it is received. The common case is
    decided without a call, as in :func:`reduction`."""
    if type(x) is np.ndarray and not x.dtype.hasobject and type(root) is int and 0 <= root < size \
            and (me == root or x.flags.writeable and x.flags.c_contiguous):
        return x, root
    x = plain(collective, "x", x)
    array(collective, "x", x)
    rank(collective, "root", root, size, world)
    if me != root:
        writable(collective, "x", x)
    return x, int(root)


def plain(collective: str, argument: str, x: Any) -> Any:
    """``x`` itself, or a plain ndarray view of a numpy subclass (``np.matrix`` would stay 2-D
    when flattened); a masked array is refused, since its mask would be silently dropped."""
    if type(x) is np.ndarray or not isinstance(x, np.ndarray):
        return x
    if isinstance(x, np.ma.MaskedArray):
        fail(collective, argument, "is a masked array, whose mask cannot travel; pass x.filled(value) "
                                   "or x.data")
    return x.view(np.ndarray)


def call_name(collective: str, value: Any) -> None:
    """``name=``: None or a string that is the same on every rank for this call."""
    if value is not None and not isinstance(value, str):
        fail(collective, "name", f"expected a str (the same on every rank) or None, got {type(value).__name__}")


def array(collective: str, argument: str, x: Any) -> None:
    if not arrays.is_array(x):
        fail(collective, argument, f"expected a numpy.ndarray (or a cupy.ndarray), got {type(x).__name__}")
    if x.dtype.hasobject:
        fail(collective, argument, f"dtype {x.dtype} holds Python objects, which have no binary layout to send")
    if not isinstance(x, np.ndarray) and x.device.id != arrays.current_gpu():
        fail(collective, argument, f"is on GPU {x.device.id}, but GPU {arrays.current_gpu()} is current "
                                   "(make the array's GPU current: see collectives.use_local_gpu)")


def reducible(collective: str, argument: str, x: np.ndarray, op: Any) -> None:
    """``x`` can be reduced with ``op``: a supported dtype and a known reduction that suits it."""
    if type(x) is np.ndarray and isinstance(op, str) and (x.dtype, op) in _ACCEPTED:
        return   # the common case in one lookup: this check runs on every call
    array(collective, argument, x)
    if x.dtype not in _REDUCIBLE and not is_bfloat16(x.dtype):
        names = ", ".join(str(d) for d in REDUCIBLE_DTYPES) + ", bfloat16 (ml_dtypes)"
        fail(collective, argument, f"unsupported dtype {x.dtype}; expected one of {names}")
    if not isinstance(op, str) or op not in OPS:
        fail(collective, "op", f"unknown reduction {op!r}; expected one of {', '.join(map(repr, OPS))}")
    if op == "avg" and x.dtype.kind in "iu":
        fail(collective, "op", f"'avg' needs a floating dtype, {argument} is {x.dtype} (use 'sum' and divide)")


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' ``bfloat16`` (numpy's, as JAX uses it), known without importing it."""
    return dtype.isbuiltin == 2 and dtype.name == "bfloat16"


def header_code(collective: str, argument: str, dtype: np.dtype) -> int:
    """``dtype``'s index in HEADER_DTYPES (-1: bfloat16), the dtypes a scatter can name to the
    ranks that do not know it."""
    if is_bfloat16(dtype):
        return -1
    if dtype not in HEADER_DTYPES:
        fail(collective, argument, f"dtype {dtype} cannot be scattered; expected one of "
                                   f"{', '.join(map(str, HEADER_DTYPES))}, bfloat16 (ml_dtypes)")
    return HEADER_DTYPES.index(dtype)


def header_dtype(code: int) -> np.dtype:
    """The dtype :func:`header_code` gave ``code``."""
    if code == -1:
        import ml_dtypes   # (present: the root has a bfloat16 array)
        return np.dtype(ml_dtypes.bfloat16)
    return HEADER_DTYPES[code]


def splits(collective: str, value: Any, rows: int | None, size: int, argument: str = "splits",
           array: str = "x") -> list[int]:
    """The rows of ``array`` that go to (or come from) each of ``size`` ranks: ``value``, a sequence
    of ``size`` ints >= 0 that add up to ``rows`` (None: any total), or None for equal blocks (then
    ``rows`` must divide evenly).

    >>> splits("alltoall", None, 6, 3), splits("alltoall", [1, 0, 5], 6, 3)
    ([2, 2, 2], [1, 0, 5])
    """
    if value is None:
        if rows % size:
            fail(collective, array, f"axis 0 has {rows} rows, which do not split evenly among {size} ranks; "
                                    f"pass {argument}= (the rows for each rank)")
        return [rows // size] * size
    try:
        counts = list(value)
    except TypeError:
        fail(collective, argument, f"expected a sequence of {size} ints (rows for each rank), got "
                                   f"{type(value).__name__}")
    if len(counts) != size:
        fail(collective, argument, f"expected {size} counts (one per rank), got {len(counts)}")
    for c in counts:
        integer(collective, argument, c)
    counts = [int(c) for c in counts]
    if min(counts) < 0:
        fail(collective, argument, f"counts must be >= 0, got {counts}")
    if rows is not None and sum(counts) != rows:
        fail(collective, argument, f"counts add up to {sum(counts)}, but {array} has {rows} rows (axis 0)")
    return counts


def array_list(collective: str, argument: str, given: Any, op: Any) -> list:
    """``given`` as a list of arrays that can each be reduced with ``op`` in place: a list or
    tuple of numpy arrays (or of cupy arrays, not both), writable, no two sharing memory."""
    if type(given) is list or type(given) is tuple:   # the common case first, without a call per array
        for a in given:
            if not (type(a) is np.ndarray and type(op) is str and (a.dtype, op) in _ACCEPTED and a.flags.writeable
                    and a.flags.c_contiguous):
                break
        else:
            if len(given) > 1:
                _apart(collective, argument, given)
            return given
    if not isinstance(given, (list, tuple)):
        fail(collective, argument, f"expected a list of arrays, got {type(given).__name__}")
    result = []
    for i, a in enumerate(given):
        a = plain(collective, f"{argument}[{i}]", a)
        reducible(collective, f"{argument}[{i}]", a, op)
        writable(collective, f"{argument}[{i}]", a)
        if result and isinstance(a, np.ndarray) != isinstance(result[0], np.ndarray):
            fail(collective, f"{argument}[{i}]", f"is a {_kind(a)}, {argument}[0] a {_kind(result[0])}: "
                                                 "one call moves host or GPU arrays, not both")
        result.append(a)
    if not result:
        reducible(collective, argument, np.empty(0, np.float64), op)   # (op is still checked)
    _apart(collective, argument, result)
    return result


def _apart(collective: str, argument: str, given: list) -> None:
    """No two arrays of ``given`` share an element. Sorted by memory extent, each array is checked
    against the one before it that reaches furthest: no quadratic scan over a model's gradients."""
    extents = sorted((arrays.extent(a), i) for i, a in enumerate(given) if a.size)
    furthest, widest = -1, -1
    for (start, end), i in extents:
        if start < furthest and (not isinstance(given[i], np.ndarray) or _overlap(given[i], given[widest])):
            first, second = sorted((i, widest))
            fail(collective, argument, f"{argument}[{first}] and {argument}[{second}] share memory; "
                                       "each array is reduced in place, so they must be apart")
        if end > furthest:
            furthest, widest = end, i


def writable(collective: str, argument: str, x: np.ndarray) -> None:
    """``x`` can take a result: writable, and no two of its elements are one place in memory (a
    stride of 0, as ``np.broadcast_to`` makes, would keep one element of many)."""
    if not getattr(x.flags, "writeable", True):   # (cupy arrays are always writable)
        fail(collective, argument, "is read-only")
    if not x.flags.c_contiguous:
        problem = _self_overlap(x)
        if problem:
            fail(collective, argument, f"{problem} (strides {x.strides}); pass an array whose elements are apart, "
                                       "such as a copy")


def _self_overlap(x: np.ndarray) -> str:
    """Why ``x`` cannot hold a result ("": it can): two of its elements share a byte. Surely not where
    each axis, by growing stride, steps past everything the smaller ones span; otherwise counted,
    up to _COUNTED_ELEMENTS (above that, an interleaving that ``np.lib.stride_tricks`` alone makes,
    it is refused as too costly to tell).

    >>> a = np.zeros(6)
    >>> _self_overlap(a[::2]), _self_overlap(a.reshape(2, 3).T)
    ('', '')
    >>> _self_overlap(np.lib.stride_tricks.as_strided(a, (3, 2), (8, 8)))
    'has elements that share memory'
    """
    axes = sorted((abs(stride), n) for stride, n in zip(x.strides, x.shape) if n > 1)
    spanned = x.itemsize
    for stride, n in axes:
        if stride < spanned:
            break
        spanned = stride * (n - 1) + spanned
    else:
        return ""
    if x.size > _COUNTED_ELEMENTS:
        return f"has its {x.size} elements interleaved in a way too costly to check for shared memory"
    offsets = sum(np.arange(n, dtype=np.int64).reshape([-1] + [1] * (x.ndim - 1 - axis)) * stride
                  for axis, (stride, n) in enumerate(zip(x.strides, x.shape)))
    starts = np.sort(np.ravel(offsets))
    return "has elements that share memory" if np.any(np.diff(starts) < x.itemsize) else ""


_COUNTED_ELEMENTS = 1 << 22   # (sorting their offsets: half a second at the most here)


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` are the same elements in the same layout (``out=x``)."""
    return a is b or (arrays.xp_of(a).may_share_memory(a, b) and a.shape == b.shape and a.strides == b.strides
                      and a.dtype == b.dtype and arrays.address(a) == arrays.address(b))


def out_array(collective: str, out: Any, x: np.ndarray, shape: tuple[int, ...], in_place: bool = True) -> bool:
    """``out`` can receive a result of ``shape`` and ``x``'s dtype, and is ``x`` itself or apart from it.

    Returns True when ``out`` is ``x``'s own memory (``out=x``: the call is in place; ``in_place``:
    whether the collective can run so, which the error for an ``out`` that overlaps x offers).
    """
    if not arrays.is_array(out) or isinstance(out, np.ndarray) != isinstance(x, np.ndarray):
        fail(collective, "out", f"expected a {_kind(x)} like x, got {type(out).__module__}.{type(out).__name__}")
    if not isinstance(out, np.ndarray) and out.device != x.device:
        fail(collective, "out", f"is on {out.device}, x on {x.device}")
    if out.shape != shape:
        fail(collective, "out", f"shape {out.shape} does not match the result's shape {shape}")
    if out.dtype != x.dtype:
        fail(collective, "out", f"dtype {out.dtype} does not match x's dtype {x.dtype}")
    writable(collective, "out", out)
    if out is x:
        return True
    if (out.flags.owndata and x.flags.owndata) or not arrays.xp_of(x).may_share_memory(out, x):
        return False   # (two arrays that own their memory never overlap: the quick common case)
    if same_array(out, x):
        return True
    if isinstance(x, np.ndarray) and not _overlap(out, x):
        return False   # views of one array that share no element, like a[:, :5] and a[:, 5:]
    fail(collective, "out", "overlaps x; pass out=x for an in-place call, or a separate array" if in_place else
         "overlaps x; pass a separate array")


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` share an element; when numpy cannot tell cheaply, assume they do."""
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except _TOO_HARD:
        return True


_TOO_HARD = getattr(np, "exceptions", np).TooHardError   # (np.exceptions from numpy 1.25; np itself before)


def _kind(x: Any) -> str:
    return "numpy.ndarray" if isinstance(x, np.ndarray) else "cupy.ndarray"


def rank(collective: str, argument: str, value: Any, size: int, world: bool = True) -> None:
    """A rank of the call's ranks: of the world, or of its group (``world=False``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(collective, argument, f"expected an int rank, got {type(value).__name__}")
    if not 0 <= value < size:
        fail(collective, argument, f"rank {value} is out of range for a {'world' if world else 'group'} of "
                                   f"{size} (0..{size - 1})")


def root(collective: str, value: Any, size: int, world: bool) -> int:
    """The root of a rooted collective: a rank of the call's ranks."""
    rank(collective, "root", value, size, world)
    return int(value)


def integer(collective: str, argument: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(collective, argument, f"expected an int, got {type(value).__name__}")


def color(collective: str, value: Any) -> None:
    """A split's color: an int >= 0 (the group), or None (no group)."""
    if value is not None:
        integer(collective, "color", value)
        if value < 0:
            fail(collective, "color", f"expected an int >= 0 or None (no group), got {value}")


def members(collective: str, argument: str, value: Any, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """A group's world ranks: distinct ints among ``allowed`` (the parent group's), at least one.

    >>> members("new_group", "ranks", [2, 0], (0, 1, 2))
    (2, 0)
    """
    try:
        ranks = list(value)
    except TypeError:
        fail(collective, argument, f"expected a list of ranks, got {type(value).__name__}")
    for r in ranks:
        integer(collective, argument, r)
    ranks = [int(r) for r in ranks]
    if not ranks:
        fail(collective, argument, "is empty; a group needs at least one rank")
    members_of_parent = set(allowed)
    outside = [r for r in ranks if r not in members_of_parent]
    if outside:
        within = (f"the world (ranks 0..{len(allowed) - 1})" if allowed == tuple(range(len(allowed)))
                  else f"the parent group {list(allowed)}")
        fail(collective, argument, f"rank(s) {outside} are not in {within}")
    if len(set(ranks)) < len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        fail(collective, argument, f"rank(s) {twice} appear more than once")
    return tuple(ranks)


def is_timeout(value: Any) -> bool:
    """A positive number of seconds (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


def bounded(seconds: float | None) -> float | None:
    """A timeout as the threading module takes it: None (no bound) for ``inf`` or anything past
    what the platform's clock can count (``threading.TIMEOUT_MAX``, about 292 years on Linux).

    >>> bounded(2.5), bounded(float("inf")), bounded(1e12), bounded(None)
    (2.5, None, None, None)
    """
    if seconds is None or seconds >= threading.TIMEOUT_MAX:
        return None
    return seconds


def timeout(collective: str, value: Any) -> None:
    """``None`` (the default from ``init``) or a positive number of seconds."""
    if value is not None and not is_timeout(value):
        fail(collective, "timeout", f"expected a positive number of seconds or None, got {value!r}")
