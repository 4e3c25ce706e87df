"""Wire compression for the all-reduce: float32 (or float64) data travels as bfloat16 or float16.

Pure numpy, no MPI: the executor (``ring.execute.run``) encodes each segment it sends into a
small wire-dtype buffer, receives into another, and decodes what it received before adding it
to this rank's own contribution in the data's own dtype. So a partial sum is rounded to the
wire type once per hop, and this rank's contribution never is before it is added.

Two codecs (:data:`CODECS`), each one entry that carries its own limits (``digits``, ``tiny``,
``largest``, ``narrow_range``), which the all-reduce, its error bound and the trainer's error
feedback read from it:

- ``"bf16"``: bfloat16, float32's exponent with 8 significant bits (relative rounding error at
  most 2**-8). It has float32's range, so sums do not overflow where float32's would not.
  numpy has no bfloat16 dtype: the wire holds the upper 16 bits of the float32 pattern as
  ``uint16``, rounded to nearest, ties to even; NaN stays NaN (quiet), infinities stay
  infinite, and a finite value past bfloat16's largest rounds to infinity, as IEEE rounding does.
- ``"fp16"``: IEEE float16, 11 significant bits (relative error at most 2**-11) but a largest
  value of 65504: sums past it become infinite on the wire (``"avg"`` pre-scales to stay in
  range: ``ring.algorithms``). float32 is converted by arithmetic on the bit patterns
  (:func:`fp16_bits`, :func:`fp16_to_float32`): the same bits as numpy's casts, which are
  30x (encode) and 8x (decode) slower on float16's subnormals, where small gradients fall;
  a NaN stays NaN (quiet).

A value that was just decoded encodes to the same bits again, so forwarding a finished chunk
re-encodes it exactly:

>>> codec = CODECS["bf16"]
>>> x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, np.nan], np.float32)
>>> wire = np.empty(x.size, codec.wire_dtype); codec.encode(x, wire)
>>> back = np.empty_like(x); codec.decode(wire, back); back       # ties go to the even neighbour
array([ 1.      ,  1.      ,  1.015625, -2.5     ,       inf,       nan],
      dtype=float32)
>>> again = np.empty_like(wire); codec.encode(back, again); bool((again == wire).all())
True

float64 data is rounded to float32 first for bfloat16 (two roundings, which in rare ties
differ from one by a unit in bfloat16's last place) and straight to float16 for ``"fp16"``.

One rounding moves a value v by at most u |v| (u = 2**-``digits``) in the wire type's normal
range, and below it by at most ``tiny``, half the smallest subnormal, however small v is: there
the error is absolute, not relative. docs/api.md's error bound counts both, per algorithm.

>>> x = np.array([2.0 ** -134, 3 * 2.0 ** -134], np.float32)   # bfloat16's subnormals are 2**-133 apart
>>> CODECS["bf16"].round_(x); (x / 2.0 ** -134).tolist()       # ties to even: all of x, or half of it
[0.0, 4.0]
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ring.arrays import ieee_floating_point, restore_floating_point

#: Elements encoded or decoded at a time: the temporaries (a few of this size) stay in cache,
#: and bounded whatever the segment.
BLOCK = 1 << 16


def blocks(count: int):
    """Slices of at most BLOCK elements that cover ``count``.

    >>> list(blocks(BLOCK + 1))[-1]
    slice(65536, 65537, None)
    """
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


# float16 by integer and float32 arithmetic on the bit patterns. numpy's own casts between
# float32 and float16 are about 30x slower where float16 is subnormal (|x| < 2**-14), which is
# where gradients live. Each function works in blocks of BLOCK, with a few whole-array ufuncs
# (no masks or fancy indexing on the common path: those cost more than the arithmetic).

#: float16's largest finite value; from 65520 (half a unit, 16, above it) up, a value rounds to inf.
FP16_LARGEST = 65504.0
#: bfloat16's: float32's largest exponent with 8 significant bits (float32's own ends 2**104 higher).
BF16_LARGEST = float(np.uint32(0x7F7F0000).view(np.float32))

#: min/max against a full array: numpy's integer minimum/maximum against a scalar is several
#: times slower than against an array (no SIMD loop for the broadcast operand).
_F16_HIGH = np.full(BLOCK, np.float32(FP16_LARGEST + 16).view(np.uint32))   # 65520 (0x477FF000): rounds to inf
_F16_LOW = np.full(BLOCK, 0x38800000, np.uint32)    # 2**-14, float16's smallest normal


def fp16_bits(x32: np.ndarray, out: np.ndarray) -> None:
    """``out`` (uint16) = the float16 nearest each float32 of ``x32`` (ties to even), as bits:
    numpy's ``astype(np.float16)`` bit for bit, except that a NaN comes out quiet (numpy keeps
    a signalling NaN signalling). Subnormals, overflow to infinity and signed zeros included.

    >>> out = np.empty(5, np.uint16)
    >>> fp16_bits(np.array([1 + 2**-11, 1 + 3 * 2**-11, 3 * 2**-25, 65520, -0.0], np.float32), out)
    >>> [hex(v) for v in out]      # ties to even: 1.0, 1 + 2**-9; 1.5 subnormal units to 2; inf; -0
    ['0x3c00', '0x3c02', '0x2', '0x7c00', '0x8000']
    """
    for b in blocks(x32.size):
        _fp16_bits_block(x32[b], out[b])


def _fp16_bits_block(x32: np.ndarray, out: np.ndarray) -> None:
    # The rounding is done by the float32 adder: M, a power of two 13 binades above |x| (and at
    # least 2**-1, so that below float16's normal range the unit is float16's subnormal one,
    # 2**-24), is added to |x|. The sum stays in M's binade, whose unit is exactly float16's unit
    # at |x|, so the hardware rounds |x| to float16's precision, to nearest even, and the sum's
    # bits are M's plus the rounded significand k (the implicit bit included). Then, modulo
    # 2**16 (all the wire keeps): M's bits are 0 there (its low bits are set to 0x800 below), so
    # sum's bits = k + 0x800, and M >> 13 = its biased exponent << 10, which turns k into the
    # float16 pattern: (e32 + 13) << 10 + 0x800 + k = (e32 - 112) << 10 + (k - 1024) mod 2**16
    # for a normal, and k itself below the normal range (M = 2**-1, e32 = 126: 0x20000 = 0).
    # A significand that rounds up to 2048 carries into the exponent, as it should (also
    # into infinity from 65520 up, after the clamp).
    n = x32.size
    bits = x32.view(np.uint32)
    mag = np.bitwise_and(bits, 0x7FFFFFFF)
    nan = mag.max(initial=0) > 0x7F800000
    np.minimum(mag, _F16_HIGH[:n], out=mag)     # past 65520 (inf too): 65520, which rounds to inf
    magic = np.maximum(mag, _F16_LOW[:n])       # at least 2**-14, so the magic is at least 2**-1
    magic &= 0x7F800000                         # the power of two at or below
    magic += 0x06800800                         # times 2**13, plus 0x800 units (see above)
    total = mag.view(np.float32)
    np.add(total, magic.view(np.float32), out=total)   # the rounding (float32, to nearest even)
    magic >>= 13
    mag += magic                                # mag: the float16 pattern in the low 16 bits
    np.right_shift(bits, 16, out=magic)
    magic &= 0x8000                             # the sign, in float16's place
    mag |= magic                                # (bit 15 of the magnitude is 0)
    np.copyto(out, mag, casting="unsafe")       # the low 16 bits
    if nan:   # a NaN came out as infinity: keep its sign and the top of its payload, quiet
        where = np.isnan(x32)
        out[where] = ((bits[where] >> 16) & 0x8000 | 0x7E00 | (bits[where] >> 13) & 0x3FF).astype(np.uint16)


def fp16_to_float32(h: np.ndarray, out: np.ndarray) -> bool:
    """``out`` (float32) = the float16 values whose bits ``h`` (uint16) holds, exactly (numpy's
    ``astype(np.float32)`` bit for bit, NaN payloads included). Returns whether any was an
    infinity or a NaN.

    >>> out = np.empty(4, np.float32)
    >>> fp16_to_float32(np.array([0x3C00, 0x8001, 0x7BFF, 0x0400], np.uint16), out), out.tolist()
    (False, [1.0, -5.960464477539063e-08, 65504.0, 6.103515625e-05])
    """
    special = False
    for b in blocks(h.size):
        special |= _fp16_to_float32_block(h[b], out[b])
    return special


def _fp16_to_float32_block(h: np.ndarray, out: np.ndarray) -> bool:
    # y = the float16 exponent and significand moved into float32's fields and rebiased (+112):
    # a normal's float32 pattern. A subnormal s * 2**-24 (exponent field 0) becomes
    # 2**-15 + s * 2**-25 instead, and its value is 2 y - 2**-14 (exact: both terms are in
    # [2**-14, 2**-13)). For a normal v, 2 v - 2**-14 >= v, for a subnormal 2 y - 2**-14 < y:
    # so the smaller of the two is the value either way, with no mask.
    wide = np.empty(h.size, np.int32)
    np.copyto(wide, h.view(np.int16))          # sign-extended: bit 31 is the sign bit
    sign = wide.view(np.uint32)
    y = np.left_shift(sign, 17)                 # (the sign shifted out)
    y >>= 4
    y += 0x38000000
    yf = y.view(np.float32)
    np.add(yf, yf, out=out)
    out -= np.float32(2.0 ** -14)
    np.minimum(out, yf, out=out)
    sign &= 0x80000000
    bits = out.view(np.uint32)
    bits |= sign
    special = y.max(initial=0) >= 0x47800000    # exponent field 31: infinity or NaN
    if special:   # float32's exponent field all ones, the payload as it was (not quieted, as numpy)
        where = y >= 0x47800000
        bits[where] = (y[where] + 0x38000000) | sign[where]
    return bool(special)


class Codec:
    """One wire format and its limits: ``wire_dtype`` is the dtype that travels (2 bytes),
    ``encode(src, dst)`` fills a wire buffer from float32/float64 data, ``decode(src, dst)`` the
    reverse (same lengths, flat, contiguous, any length including 0).

    >>> c = CODECS["fp16"]; w = np.empty(2, c.wire_dtype); c.encode(np.array([3.0, 1e5]), w); w
    array([ 3., inf], dtype=float16)
    >>> c.largest, c.narrow_range, CODECS["bf16"].narrow_range
    (65504.0, True, False)
    """

    def __init__(self, name: str, wire_dtype: np.dtype, encode: Callable, decode: Callable, digits: int,
                 tiny: float, largest: float, narrow_range: bool = False):
        self.name = name
        self.wire_dtype = np.dtype(wire_dtype)
        self._encode, self._decode = encode, decode
        #: Significant bits of the wire type (its unit roundoff is 2**-digits).
        self.digits = digits
        #: The largest error of rounding a value below the wire type's normal range (half its
        #: smallest subnormal): an absolute error where the relative bound no longer holds.
        self.tiny = tiny
        #: The largest finite value on the wire: past it by half a unit, a value becomes inf.
        self.largest = largest
        #: Its range is far below float32's (float16's 65504), so a sum can overflow where float32's
        #: would not: "avg" divides each contribution by n before summing (``ring.algorithms``), and
        #: error feedback saturates at ``largest`` (``trainer.compression``).
        self.narrow_range = narrow_range

    def __repr__(self) -> str:
        return f"<Codec {self.name}: {self.wire_dtype} on the wire>"

    def encode(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (wire dtype) = ``src`` (float32 or float64) rounded to the wire type."""
        quiet = ieee_floating_point()   # (an overflow to inf is the rounding's result, not an error)
        try:
            for b in blocks(src.size):
                self._encode(src[b], dst[b])
        finally:
            restore_floating_point(quiet)

    def decode(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (float32 or float64) = ``src`` (wire dtype), exactly."""
        quiet = ieee_floating_point()   # (a signalling NaN widened is still a NaN, not an error)
        try:
            for b in blocks(src.size):
                self._decode(src[b], dst[b])
        finally:
            restore_floating_point(quiet)

    def round_(self, x: np.ndarray) -> None:
        """``x`` = ``x`` rounded through the wire type, in place (what a receiver of ``x`` would decode).

        >>> x = np.array([1 + 2**-8, 0.1], np.float32); CODECS["bf16"].round_(x); x
        array([1.        , 0.10009766], dtype=float32)
        """
        encoded = np.empty(min(x.size, BLOCK), self.wire_dtype)
        quiet = ieee_floating_point()
        try:
            for b in blocks(x.size):
                w = encoded[:b.stop - b.start]
                self._encode(x[b], w)
                self._decode(w, x[b])
        finally:
            restore_floating_point(quiet)

    def wire_bytes(self, count: int) -> int:
        """The bytes ``count`` elements take on the wire.

        >>> CODECS["bf16"].wire_bytes(1000)
        2000
        """
        return count * self.wire_dtype.itemsize


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
    if src.dtype == np.float32:
        fp16_bits(src, dst.view(np.uint16))
    else:   # float64 rounds straight to float16 (once): numpy's cast, as before
        np.copyto(dst, src, casting="unsafe")


def _fp16_decode(src: np.ndarray, dst: np.ndarray) -> None:
    if dst.dtype == np.float32:
        fp16_to_float32(src.view(np.uint16), dst)
        return
    # float64: widened through float32 (both exact), except where a NaN is: numpy's float32 to
    # float64 cast quiets a signalling NaN, its float16 to float64 cast does not
    narrow = np.empty(src.size, np.float32)
    if fp16_to_float32(src.view(np.uint16), narrow):
        np.copyto(dst, src)
    else:
        np.copyto(dst, narrow)


#: The codecs by the name ``compression=`` takes: the one list of them (``col.table.CODECS`` for
#: programs: the trainer's ``--compression``, the bench's compressed columns).
CODECS: dict[str, Codec] = {
    "bf16": Codec("bf16", np.uint16, _bf16_encode, _bf16_decode, digits=8, tiny=2.0 ** -134, largest=BF16_LARGEST),
    "fp16": Codec("fp16", np.float16, _fp16_encode, _fp16_decode, digits=11, tiny=2.0 ** -25, largest=FP16_LARGEST,
                  narrow_range=True),
}

#: The dtypes whose data can be compressed (bfloat16 arrays are reduced through float32).
COMPRESSIBLE = (np.dtype(np.float32), np.dtype(np.float64))


def codec(name: Any) -> Codec | None:
    """The codec called ``name``, None for None; KeyError for any other name.

    >>> codec("fp16"), codec(None)
    (<Codec fp16: float16 on the wire>, None)
    """
    return None if name is None else CODECS[name]
