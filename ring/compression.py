"""Wire compression for the all-reduce: float32 (or float64) data travels as bfloat16 or float16.

Pure numpy, no MPI: the executor (``ring.execute.run``) encodes each segment it sends into a
small wire-dtype buffer, receives into another, and decodes what it received before adding it
to this rank's own contribution in the data's own dtype. So a partial sum is rounded to the
wire type once per hop, and this rank's contribution never is before it is added.

Two codecs (:data:`CODECS`):

- ``"bf16"``: bfloat16, float32's exponent with 8 significant bits (relative rounding error at
  most 2**-8). It has float32's range, so sums do not overflow where float32's would not.
  numpy has no bfloat16 dtype: the wire holds the upper 16 bits of the float32 pattern as
  ``uint16``, rounded to nearest, ties to even; NaN stays NaN (quiet), infinities stay
  infinite, and a finite value past bfloat16's largest rounds to infinity, as IEEE rounding does.
- ``"fp16"``: IEEE float16, 11 significant bits (relative error at most 2**-11) but a largest
  value of 65504: sums past it become infinite on the wire (``"avg"`` pre-scales to stay in
  range: ``ring.algorithms``).

A value that was just decoded encodes to the same bits again, so forwarding a finished chunk
re-encodes it exactly:

>>> codec = CODECS["bf16"]
>>> x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, np.nan], np.float32)
>>> wire = np.empty(x.size, codec.wire); codec.encode(x, wire)
>>> back = np.empty_like(x); codec.decode(wire, back); back       # ties go to the even neighbour
array([ 1.      ,  1.      ,  1.015625, -2.5     ,       inf,       nan],
      dtype=float32)
>>> again = np.empty_like(wire); codec.encode(back, again); bool((again == wire).all())
True

float64 data is rounded to float32 first for bfloat16 (two roundings, which in rare ties
differ from one by a unit in bfloat16's last place) and straight to float16 for ``"fp16"``.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ring.arrays import ieee_floating_point, restore_floating_point

#: Elements encoded or decoded at a time: the temporaries (a few of this size) stay in cache,
#: and bounded whatever the segment.
BLOCK = 1 << 16


def _blocks(count: int):
    for start in range(0, count, BLOCK):
        yield slice(start, min(start + BLOCK, count))


def bf16_bits(x32: np.ndarray, out: np.ndarray) -> None:
    """``out`` (uint16) = the bfloat16 nearest each float32 of ``x32`` (ties to even), as bits.

    >>> out = np.empty(3, np.uint16)
    >>> bf16_bits(np.array([1.0, 1 + 2**-8, 1 + 2**-8 + 2**-20], np.float32), out); [hex(v) for v in out]
    ['0x3f80', '0x3f80', '0x3f81']
    """
    bits = x32.view(np.uint32)
    t = np.right_shift(bits, 16)
    np.bitwise_and(t, 1, out=t)          # the lowest kept bit: a tie rounds up only when it is odd
    t += 0x7FFF
    t += bits                            # (wraps only for negative NaNs, which are set below)
    t >>= 16
    np.copyto(out, t, casting="unsafe")
    nan = np.isnan(x32)
    if nan.any():   # rounding could carry a NaN's payload into the exponent (an infinity): keep it NaN
        out[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x0040


class Codec:
    """One wire format: ``wire`` is the dtype that travels (2 bytes), ``encode(src, dst)`` fills
    a wire buffer from float32/float64 data, ``decode(src, dst)`` the reverse (same lengths,
    flat, contiguous, any length including 0).

    >>> c = CODECS["fp16"]; w = np.empty(2, c.wire); c.encode(np.array([3.0, 1e5]), w); w
    array([ 3., inf], dtype=float16)
    """

    def __init__(self, name: str, wire: np.dtype, encode: Callable, decode: Callable, digits: int, tiny: float):
        self.name = name
        self.wire = np.dtype(wire)
        self._encode, self._decode = encode, decode
        #: Significant bits of the wire type (its unit roundoff is 2**-digits).
        self.digits = digits
        #: The largest error of rounding a value below the wire type's normal range (half its
        #: smallest subnormal): an absolute error where the relative bound no longer holds.
        self.tiny = tiny

    def __repr__(self) -> str:
        return f"<Codec {self.name}: {self.wire} on the wire>"

    def encode(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (wire dtype) = ``src`` (float32 or float64) rounded to the wire type."""
        quiet = ieee_floating_point()   # (an overflow to inf is the rounding's result, not an error)
        try:
            for b in _blocks(src.size):
                self._encode(src[b], dst[b])
        finally:
            restore_floating_point(quiet)

    def decode(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (float32 or float64) = ``src`` (wire dtype), exactly."""
        quiet = ieee_floating_point()   # (a signalling NaN widened is still a NaN, not an error)
        try:
            for b in _blocks(src.size):
                self._decode(src[b], dst[b])
        finally:
            restore_floating_point(quiet)

    def round_(self, x: np.ndarray) -> None:
        """``x`` = ``x`` rounded through the wire type, in place (what a receiver of ``x`` would decode).

        >>> x = np.array([1 + 2**-8, 0.1], np.float32); CODECS["bf16"].round_(x); x
        array([1.        , 0.10009766], dtype=float32)
        """
        wire = np.empty(min(x.size, BLOCK), self.wire)
        quiet = ieee_floating_point()
        try:
            for b in _blocks(x.size):
                w = wire[:b.stop - b.start]
                self._encode(x[b], w)
                self._decode(w, x[b])
        finally:
            restore_floating_point(quiet)

    def wire_bytes(self, count: int) -> int:
        """The bytes ``count`` elements take on the wire.

        >>> CODECS["bf16"].wire_bytes(1000)
        2000
        """
        return count * self.wire.itemsize


def _bf16_encode(src: np.ndarray, dst: np.ndarray) -> None:
    bf16_bits(src if src.dtype == np.float32 else src.astype(np.float32), dst)


def _bf16_decode(src: np.ndarray, dst: np.ndarray) -> None:
    if dst.dtype == np.float32:
        bits = dst.view(np.uint32)
        np.copyto(bits, src)
        bits <<= 16
    else:
        wide = np.empty(src.size, np.uint32)
        np.copyto(wide, src)
        wide <<= 16
        np.copyto(dst, wide.view(np.float32))


def _fp16_encode(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")   # numpy's cast rounds to nearest even, past 65504 to inf


def _fp16_decode(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst, src)


#: The codecs by the name ``compression=`` takes.
CODECS: dict[str, Codec] = {
    "bf16": Codec("bf16", np.uint16, _bf16_encode, _bf16_decode, digits=8, tiny=2.0 ** -134),
    "fp16": Codec("fp16", np.float16, _fp16_encode, _fp16_decode, digits=11, tiny=2.0 ** -25),
}

#: The dtypes whose data can be compressed (bfloat16 arrays are reduced through float32).
COMPRESSIBLE = (np.dtype(np.float32), np.dtype(np.float64))


def codec(name: Any) -> Codec | None:
    """The codec called ``name``, None for None; KeyError for any other name.

    >>> codec("fp16"), codec(None)
    (<Codec fp16: float16 on the wire>, None)
    """
    return None if name is None else CODECS[name]
