"""Every difference between numpy (host) and cupy (device) arrays lives here.

The executor and the algorithms call these helpers instead of naming an array
library, so the same ring runs over both.
"""
from __future__ import annotations

import functools
import threading
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

#: The elementwise ufunc that combines two contributions, per reduction name.
#: "avg" sums here; the division by the world size is done once per element elsewhere.
REDUCE_UFUNC_NAMES = {"sum": "add", "avg": "add", "prod": "multiply", "min": "minimum", "max": "maximum"}


def xp_of(x: Any) -> ModuleType:
    """The array module (numpy or cupy) that owns ``x``."""
    if isinstance(x, np.ndarray):
        return np
    module = type(x).__module__.split(".")[0]
    if module == "cupy":
        import cupy
        return cupy
    raise TypeError(f"not a numpy or cupy array: {type(x).__name__}")


def is_array(x: Any) -> bool:
    """True for a numpy or a cupy array (cupy is not imported to find out)."""
    return isinstance(x, np.ndarray) or type(x).__module__.split(".")[0] == "cupy"


def address(x: Any) -> int:
    """Where ``x``'s first element lives (host or device pointer)."""
    return x.ctypes.data if isinstance(x, np.ndarray) else x.data.ptr


def extent(x: Any) -> tuple[int, int]:
    """The bytes ``[start, end)`` that hold ``x``'s elements (strides may skip some; x not empty)."""
    start = end = address(x)
    for n, stride in zip(x.shape, x.strides):
        reach = (n - 1) * stride
        start, end = (start + reach, end) if reach < 0 else (start, end + reach)
    return start, end + x.itemsize


def current_gpu() -> int:
    """The index of this process's current GPU (cupy must be installed)."""
    import cupy
    return cupy.cuda.runtime.getDevice()


def to_host(x: Any) -> np.ndarray:
    """A host copy of ``x`` (for cupy, this waits for the work queued on its stream)."""
    return np.array(x) if isinstance(x, np.ndarray) else x.get()


def copy_from_host(dst: Any, host: np.ndarray) -> None:
    """``dst[...] = host`` where ``dst`` may live on the device (contiguous, same shape and dtype)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, host, casting="no")
    else:
        dst.set(host)


@lru_cache(maxsize=None)
def ufunc(xp: ModuleType, op: str):
    """The ufunc of ``xp`` that combines two contributions by ``op`` ("avg" sums).

    >>> ufunc(np, "max")(np.array([1., 5]), np.array([4., 0]))
    array([4., 5.])
    """
    return getattr(xp, REDUCE_UFUNC_NAMES[op])


@lru_cache(maxsize=None)
def combiner(xp: ModuleType, op: str):
    """``combine(out, mine, received)``: ``out = op(mine, received)`` elementwise, no temporaries.

    >>> out = np.zeros(3); combiner(np, "max")(out, np.array([1., 5, 2]), np.array([4., 0, 2])); out
    array([4., 5., 2.])
    """
    combined = ufunc(xp, op)

    def combine(out, mine, received):
        combined(mine, received, out=out)

    return combine


def transportable(x):
    """``x``, or a view of it as unsigned integers of its item size where its dtype exports no
    buffer (numpy's user dtypes, like ml_dtypes' ``bfloat16``), so that MPI can move its bytes.

    >>> transportable(np.zeros(2, np.float32)).dtype     # (a bfloat16 array comes back as uint16)
    dtype('float32')
    """
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.isbuiltin == 2 else x


def divide_(x, divisor: int) -> None:
    """``x /= divisor`` in place, in x's own dtype (floating types only)."""
    xp_of(x).true_divide(x, divisor, out=x, casting="unsafe")


def copy_(dst, src) -> None:
    """``dst[...] = src`` for two arrays of one module."""
    xp_of(dst).copyto(dst, src, casting="no")


_scratch_pools = threading.local()   # per thread: two callers never share a receive buffer


def scratch(like, elems: int, slot: int, dtype=None):
    """A reusable receive buffer of ``elems`` elements of ``dtype`` (default: ``like``'s), in
    ``like``'s array module, one per ``slot``.

    Kept between calls (a fresh multi-MiB buffer per call costs page faults every
    time). The pool holds at most one buffer per (module, slot), as large as the
    largest asked for, so memory stays at two of the largest transfers (at most two
    segments) per thread however large the tensors are; a compressed call uses a few
    more slots (``ring.execute``), each at most a segment.
    """
    xp = xp_of(like)
    dtype = like.dtype if dtype is None else dtype
    nbytes = elems * dtype.itemsize
    pool = _scratch_pools.__dict__
    key = (xp.__name__, slot)
    buf = pool.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = pool[key] = xp.empty(max(nbytes, 1), dtype=xp.uint8)
    return buf[:nbytes].view(dtype)


def _errstate_enter() -> Any:
    state = np.errstate(all="ignore")
    state.__enter__()
    return state


def _errstate_exit(state: Any) -> None:
    state.__exit__(None, None, None)


try:   # numpy >= 2 keeps the floating-point error state in a context variable: two C calls, ~0.2 us
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj
    #: ``token = ieee_floating_point()`` makes this thread's numpy arithmetic follow IEEE rules
    #: silently (overflow gives inf, 0/0 nan; no FloatingPointError, no RuntimeWarning), whatever
    #: the program set with ``np.seterr``; ``restore_floating_point(token)`` undoes it. A reduction
    #: must give the same result on every rank: raising on one rank halfway through a collective
    #: would leave the others waiting.
    ieee_floating_point = functools.partial(_extobj_contextvar.set, _make_extobj(all="ignore"))
    restore_floating_point = _extobj_contextvar.reset
except ImportError:   # numpy 1.x: the public (slower, ~2 us) way
    ieee_floating_point, restore_floating_point = _errstate_enter, _errstate_exit


def synchronize(x) -> None:
    """Block the host until work queued on ``x``'s device is done (no-op for numpy)."""
    xp = xp_of(x)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
