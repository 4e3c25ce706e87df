"""Error feedback for a compressed all-reduce (``--compression bf16|fp16``): each rank keeps what
compression took from its contribution and adds it to its next one, so that nothing is lost for
good, only late (1-bit SGD's and DDP's compression hooks' rule, here on the trainer's side: the
ring compresses, the trainer remembers).

The rank rounds its buffer to the wire type itself, before the all-reduce (``contribute``), so
that what it sends is exactly representable on the wire: what compression changed of its
contribution is then known here, to the bit, whatever the ring's codec does on the next hops
(those sums are the ring's own rounding, which no single rank owns).

>>> import numpy as np
>>> fb = ErrorFeedback(np.zeros(2, np.float32), "bf16")
>>> g = np.array([1 + 3 * 2 ** -10, 3.0], np.float32)
>>> fb.contribute(g); g, fb.residual * 2 ** 10        # bf16 keeps 8 bits: 1 + 3/1024 goes down to 1
(array([1., 3.], dtype=float32), array([3., 0.], dtype=float32))
>>> g = np.array([1 + 3 * 2 ** -10, 3.0], np.float32)
>>> fb.contribute(g); g, fb.residual * 2 ** 10        # the next step carries what the last lost: up
(array([1.0078125, 3.       ], dtype=float32), array([-2.,  0.], dtype=float32))
"""
from __future__ import annotations

import numpy as np

import collectives as col

#: The wire types of ``--compression`` (besides "none"): the runtime's codecs (``col.table.CODECS``).
CODECS = tuple(col.table.CODECS)


def wire_roundtrip(x: np.ndarray, codec: str) -> np.ndarray:
    """``x`` rounded to the wire type ``codec`` and back, as a new array (``col.round_to_wire``,
    the ring's own codec), but where the codec's range is narrow (fp16: ``Codec.narrow_range``)
    with magnitudes beyond it saturated at its largest finite value instead of becoming inf: an
    inf would make the residual -inf and the next step NaN; saturated, the excess waits in the residual.

    >>> wire_roundtrip(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5], np.float32), "bf16")   # ties to even
    array([ 1.      ,  1.015625, -2.5     ], dtype=float32)
    >>> wire_roundtrip(np.array([0.1, 7e4]), "fp16")
    array([9.99755859e-02, 6.55040000e+04])
    """
    limits = col.table.CODECS[codec]
    if limits.narrow_range:
        x = np.clip(x, -limits.largest, limits.largest)
    return col.round_to_wire(x, codec)


class ErrorFeedback:
    """This rank's residual: what compression took from its contributions so far, added back to
    the next one. One per buffer that is all-reduced compressed (the flat gradients of the
    all-reduce strategy, DiLoCo's delta), laid out like it; ``contribute`` works on slices too
    (a gradient bucket), each with its own part of the residual.

    >>> fb = ErrorFeedback(np.zeros(3, np.float32), "fp16")
    >>> g = np.array([1e-8, 1.0, 2049.0], np.float32); fb.contribute(g); g, fb.residual
    (array([0.000e+00, 1.000e+00, 2.048e+03], dtype=float32), array([1.e-08, 0.e+00, 1.e+00], dtype=float32))
    """

    def __init__(self, like, codec: str):
        self.codec = codec
        self.residual = np.zeros_like(like)

    def contribute(self, buffer, start: int = 0, stop: int | None = None) -> None:
        """Turn ``buffer`` (the span ``start:stop`` of the whole buffer, or all of it) into what this
        rank sends: buffer + residual, rounded to the wire type; the residual keeps the rest."""
        residual = self.residual[start:stop if stop is not None else start + buffer.size]
        buffer += residual
        sent = wire_roundtrip(buffer, self.codec)
        residual[...] = buffer
        residual -= sent   # (exact: a float minus its rounding to fewer bits fits the float)
        buffer[...] = sent

    def clear(self) -> None:
        """Forget the residual (a change of the world, or a checkpoint of another world: the lost
        bits of at most one step are dropped, where otherwise they would belong to no rank)."""
        self.residual[...] = 0
