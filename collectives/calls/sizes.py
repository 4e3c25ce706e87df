"""Byte counts as people write them: "64M" to bytes and back. Suffixes are binary, as in
nccl-tests (K = 1024, M = 1024**2, G = 1024**3); a trailing "B" or "iB" is allowed, and case
does not matter. The settings (``COLLECTIVES_SEGMENT_BYTES=4M``) and the bench read sizes so.

>>> parse_size("64M"), parse_size("8"), parse_size("1.5KiB")
(67108864, 8, 1536)
>>> format_size(67108864), format_size(1536), format_size(8)
('64M', '1.5K', '8')
"""
from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("4096", "64K", "256MiB", "1G"); ValueError if it is not a size."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 8, 64K, 256M, 1G)")
    number, unit = match.groups()
    value = float(number) * _UNITS[unit.upper()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def format_size(nbytes: int) -> str:
    """The shortest binary-suffixed spelling of ``nbytes`` (the inverse of parse_size)."""
    for unit in ("G", "M", "K"):
        value = nbytes / _UNITS[unit]
        if value >= 1:
            return f"{value:g}{unit}"
    return str(nbytes)
