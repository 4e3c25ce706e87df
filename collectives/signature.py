"""What every rank must agree on before a collective moves data, and the error when they don't.

A signature is a short byte string (at most ``ring.doubling.SIGNATURE_BYTES``)
made of the call's fields; ranks compare signatures byte for byte. Only when
they differ are the fields decoded again, to say which ones differ and how:

>>> a = signature("allreduce", 7, op="sum", dtype=np.dtype("float32"), shape=(1000,))
>>> b = signature("allreduce", 7, op="sum", dtype=np.dtype("float32"), shape=(1001,))
>>> print(disagreement("allreduce", [a, a, b]))
allreduce: x: count differs across ranks: rank 0: 1000, rank 2: 1001
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ring.doubling import SIGNATURE_BYTES

#: The fields, in the order they are packed: (name in messages, argument it belongs to).
FIELDS = (
    ("collective", ""),
    ("sequence number", ""),
    ("op", "op"),
    ("dtype", "x"),
    ("count", "x"),
    ("shape", "x"),
    ("root", "root"),
    ("small-message threshold (COLLECTIVES_SMALL_BYTES)", ""),
    ("argument check", ""),
    ("memory (host or gpu)", "x"),
)
_SHOWN_RANKS = 8


def signature(collective: str, seq: int, op: str = "", dtype: np.dtype | None = None, shape: tuple | None = None,
              root: int = -1, small_bytes: int = 0, rejected: bool = False, memory: str = "") -> bytes:
    """The bytes every rank compares. ``shape=None``: no array (barrier); for allgather pass the
    trailing shape (axis 0 may differ), whose count is not compared. ``memory``: "host" or "gpu"."""
    return _fields(collective, op, dtype, shape, root, small_bytes, rejected, memory) % seq


@lru_cache(maxsize=1024)
def _fields(collective: str, op: str, dtype: np.dtype | None, shape: tuple | None, root: int,
            small_bytes: int, rejected: bool, memory: str) -> bytes:
    """Everything but the sequence number, as a ``%d`` template (cached: calls repeat)."""
    dtype_text = "" if dtype is None else dtype.name if dtype.isnative else dtype.str
    count = "" if shape is None or collective == "allgather" else _count(shape)
    shape_text = "" if shape is None else str(shape)
    if len(shape_text) > SIGNATURE_BYTES // 2:   # a very long shape: compare a digest of it instead
        shape_text = f"#{hash(tuple(shape)) & (2**60 - 1):x}"
    return (f"{collective}|%d|{op}|{dtype_text}|{count}|{shape_text}|{root}|{small_bytes}|"
            f"{'rejected' if rejected else 'ok'}|{memory}").encode()


def _count(shape: tuple) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def disagreement(collective: str, signatures: list[bytes]) -> str:
    """The message for a call whose ranks passed ``signatures`` (not all equal), naming each field
    that differs and each rank's value. A differing count hides the shape (it says the same)."""
    rows = [s.rstrip(b"\0").decode(errors="replace").split("|") for s in signatures]
    rows = [r + [""] * (len(FIELDS) - len(r)) for r in rows]
    differing = [i for i in range(len(FIELDS)) if any(r[i] != rows[0][i] for r in rows)]
    if 4 in differing:
        differing = [i for i in differing if i != 5]
    clauses = []
    for i in differing:
        name, argument = FIELDS[i]
        if collective == "allgather" and name == "shape":
            name = "trailing shape"
        prefix = f"{argument}: " if argument else ""
        clauses.append(f"{prefix}{name} differs across ranks: {_listing([r[i] for r in rows])}")
    return f"{collective}: " + "; ".join(clauses or ["ranks disagree about this call"])


def _listing(values: list[str]) -> str:
    """Rank 0's value and every rank that differs from it (at most a few, then a count)."""
    shown = [0] + [r for r, v in enumerate(values) if v != values[0]]
    more = len(shown) - _SHOWN_RANKS
    text = ", ".join(f"rank {r}: {values[r] or '-'}" for r in shown[:_SHOWN_RANKS])
    return text + (f", and {more} more" if more > 0 else "")
