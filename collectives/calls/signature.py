"""What every rank must agree on before a collective moves data, and the error when they don't.

A signature is a short byte string (at most ``ring.doubling.SIGNATURE_BYTES``)
made of the call's fields; ranks compare signatures byte for byte. Only when
they differ are the fields decoded again, to say which ones differ and how:

>>> a = signature("allreduce", 7, op="sum", dtype=np.dtype("float32"), shape=(1000,))
>>> b = signature("allreduce", 7, op="sum", dtype=np.dtype("float32"), shape=(1001,))
>>> print(disagreement("allreduce", [a, a, b]))
allreduce: x: count differs across ranks: rank 0: 1000, rank 2: 1001

Calls that look alike (the same collective on the same kind of array) cannot be
told apart, so a rank that skips one of them pairs its next call with the others'
skipped one. ``name=`` makes such calls differ:

>>> c = signature("allreduce", 8, op="sum", dtype=np.dtype("float32"), shape=(1000,), name="step 7")
>>> d = signature("allreduce", 8, op="sum", dtype=np.dtype("float32"), shape=(1000,), name="step 8")
>>> print(disagreement("allreduce", [c, d]))
allreduce: name: name differs across ranks: rank 0: step 7, rank 1: step 8
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from collectives.calls.table import WHOLE_SHAPE, compared_shape
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
    ("name", "name"),
    ("calling thread", ""),
    ("argument check", ""),
    ("memory (host or gpu)", "x"),
    ("algorithm", "algorithm"),
    ("compression", "compression"),
    ("reproducible", "reproducible"),
)
_THREAD = [name for name, _ in FIELDS].index("calling thread")
_SHOWN_RANKS = 8
_LONGEST_FIELD = 24   # a longer value is compared as a digest, so that every signature fits
_SEQUENCE_DIGITS = 20   # a sequence number's most digits (2**64)


def signature(collective: str, seq: int, op: str = "", dtype: np.dtype | None = None, shape: tuple | None = None,
              root: int = -1, rejected: bool = False, memory: str = "", name: str = "", thread: str = "",
              algorithm: str = "", compression: str = "", reproducible: bool = False) -> bytes:
    """The bytes every rank compares. ``shape=None``: no array (barrier); for allgather pass the
    trailing shape (axis 0 may differ), whose count is not compared. ``memory``: "host" or "gpu";
    ``name``: the caller's name for the call; ``thread``: the calling thread's name; ``algorithm``:
    the one the call forces ("": the runtime's choice); ``compression``: the all-reduce's wire
    codec ("": none); ``reproducible``: an all-reduce's ``reproducible=True``.

    >>> plain = signature("allreduce", 3, op="sum", dtype=np.dtype("float32"), shape=(8,))
    >>> print(disagreement("allreduce", [plain, signature("allreduce", 3, op="sum", dtype=np.dtype("float32"),
    ...                                                   shape=(8,), compression="bf16")]))
    allreduce: compression: compression differs across ranks: rank 0: -, rank 1: bf16
    """
    return template(collective, op, dtype, shape, root, rejected, memory, name, thread, algorithm, compression,
                    reproducible) % seq


@lru_cache(maxsize=1024)
def template(collective: str, op: str, dtype: np.dtype | None, shape: tuple | None, root: int,
             rejected: bool, memory: str, name: str, thread: str, algorithm: str = "",
             compression: str = "", reproducible: bool = False) -> bytes:
    """Everything but the sequence number, as a ``%d`` template (cached: calls repeat, and a hit
    costs the call path no Python frame). At most ``SIGNATURE_BYTES`` with any sequence number."""
    dtype_text = "" if dtype is None else dtype.name if dtype.isnative and dtype.fields is None else str(dtype)
    count = "" if shape is None or compared_shape(collective) != WHOLE_SHAPE else _count(shape)
    shape_text = "" if shape is None else str(shape)
    fields = [_fit(text.replace("%", "%%").replace("|", "/"))
              for text in (op, dtype_text, str(count), shape_text, str(root), name, thread)]
    op_text, dtype_text, count_text, shape_text, root_text, name, thread = fields
    made = (f"{collective}|%d|{op_text}|{dtype_text}|{count_text}|{shape_text}|{root_text}|{name}|{thread}|"
            f"{'rejected' if rejected else 'ok'}|{memory}|{algorithm}|{compression}|{'yes' if reproducible else ''}").encode()
    if len(made) + _SEQUENCE_DIGITS > SIGNATURE_BYTES:
        raise ValueError(f"signature template of {len(made)} bytes; at most {SIGNATURE_BYTES - _SEQUENCE_DIGITS}")
    return made


def _fit(text: str) -> str:
    """``text``, or a digest of it when it is long (the same on every rank, unlike ``hash``)."""
    if len(text.encode()) <= _LONGEST_FIELD:
        return text
    return "#" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _count(shape: tuple) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def disagreement(collective: str, signatures: list[bytes], names: tuple[int, ...] | None = None,
                 group: str = "") -> str:
    """The message for a call whose ranks passed ``signatures`` (not all equal), naming each field
    that differs and each rank's value, ranks named by ``names`` (world ranks; default: their
    place in ``signatures``), in ``group`` (its name, "" for the world). A differing count hides
    the shape (it says the same)."""
    rows = [s.rstrip(b"\0").decode(errors="replace").split("|") for s in signatures]
    rows = [r + [""] * (len(FIELDS) - len(r)) for r in rows]
    for r in rows:   # (the main thread's calls leave it empty; any other thread may be named "MainThread")
        r[_THREAD] = f"thread {r[_THREAD]!r}" if r[_THREAD] else "the main thread"
    differing = [i for i in range(len(FIELDS)) if any(r[i] != rows[0][i] for r in rows)]
    if 0 in differing:
        differing = [0]   # other collectives have other fields: comparing them says nothing more
    if 4 in differing:
        differing = [i for i in differing if i != 5]
    clauses = []
    for i in differing:
        name, argument = FIELDS[i]
        if name == "shape":   # (what stands for x's whole shape: the table's)
            name, argument = compared_shape(collective)
        if collective == "scatter" and argument == "x":
            argument = "out"   # (a scatter's signature carries its out, the root's x travels in the header)
        prefix = f"{argument}: " if argument else ""
        clauses.append(f"{prefix}{name} differs across ranks: {_listing([r[i] for r in rows], names)}")
    where = f" on {group}" if group else ""
    return f"{collective}{where}: " + "; ".join(clauses or ["ranks disagree about this call"])


def _listing(values: list[str], names: tuple[int, ...] | None = None) -> str:
    """The first rank's value and every rank that differs from it (at most a few, then a count)."""
    shown = [0] + [r for r, v in enumerate(values) if v != values[0]]
    more = len(shown) - _SHOWN_RANKS
    names = names or range(len(values))
    text = ", ".join(f"rank {names[r]}: {values[r] or '-'}" for r in shown[:_SHOWN_RANKS])
    return text + (f", and {more} more" if more > 0 else "")
