"""Compression's arithmetic as the tests check it: the documented error bound of ``compression=``
(docs/api.md, "Error bound"; tests/test_compression_bounds.py says it in full), the exact error, and
the compressed ring all-reduce modelled in one process."""
from fractions import Fraction

import numpy as np

from ring.partition import chunk_bounds

#: eps and t_data of the data's dtype (float64's t_data, 2**-1075, is not a float64: 2**-1074
#: stands for it).
DATA = {np.dtype(np.float32): (2.0 ** -24, 2.0 ** -150), np.dtype(np.float64): (2.0 ** -53, 2.0 ** -1074)}


def log2_up(n: int) -> int:
    """ceil(log2 n): the steps of halving (or of recursive doubling) on n ranks, the fold of the
    ranks past the largest power of two included.

    >>> [log2_up(n) for n in range(1, 9)]
    [0, 1, 2, 2, 3, 3, 3, 3]
    """
    return (n - 1).bit_length()


def counts(algorithm: str, n: int, op: str, prescale: bool, hosts: int = 1) -> tuple[int, int, int, int]:
    """(m, k, r, d) of the documented bound for ``algorithm`` (``algorithm=``'s names) on n ranks,
    on ``hosts`` hosts of n // hosts ranks for "hierarchical"; ``prescale``: "avg" divides each
    contribution by n first (the fp16 wire does).

    >>> counts("ring", 4, "sum", False), counts("halving", 5, "sum", False), counts("doubling", 5, "avg", False)
    ((4, 3, 4, 0), (4, 3, 5, 0), (0, 4, 0, 1))
    >>> counts("ring", 4, "avg", True), counts("hierarchical", 6, "avg", True, hosts=3)
    ((4, 4, 4, 4), (3, 5, 3, 4))
    """
    d = 0
    if algorithm == "ring":
        m, k, r, ranks = n, n - 1, n, n
    elif algorithm == "halving":
        m, k, r, ranks = log2_up(n) + 1, log2_up(n), n, n
    elif algorithm == "doubling":   # (uncompressed: no wire rounding)
        m, k, r, ranks = 0, log2_up(n), 0, n
    else:   # the uncompressed ring within each host, then the compressed ring across the hosts
        m, k, r, ranks = hosts, n // hosts - 1 + hosts - 1, hosts, hosts
        if op == "avg":
            k, d = k + 1, 1   # (within a host the sum is divided once)
    if op == "avg":
        k += 1
        d += ranks if prescale and algorithm != "doubling" else 1
    return m, k, r, d


def bound(inputs, op, codec, algorithm="ring", hosts=1) -> np.ndarray:
    """The documented bound on |result - exact sum (or mean)| for each element of ``inputs`` (one
    flat float32 or float64 array per rank), in float64 (whose own rounding, a part in 1e16, is far
    inside the bound's second-order slack).

    >>> one_tie = [np.array([2.0 ** -134], np.float32)] * 2    # each rounds to 0 on the bf16 wire
    >>> round(float(bound(one_tie, "sum", CODECS["bf16"])[0] / 2.0 ** -133), 4)   # sum |x| is 2**-133
    1.0157
    """
    n, dtype = len(inputs), inputs[0].dtype
    eps, t_data = DATA[dtype]
    u, t = 2.0 ** -codec.digits, codec.tiny
    if codec.name == "bf16" and dtype == np.float64:   # rounded to float32 on the way to bfloat16
        u, t = u + 2.0 ** -24, t + 2.0 ** -150
    m, k, r, d = counts(algorithm, n, op, prescale=codec.narrow_range, hosts=hosts)
    y = m * u + k * eps
    magnitude = np.sum(np.abs(np.stack(inputs).astype(np.float64)), axis=0) / (n if op == "avg" else 1)
    return np.expm1(y) * magnitude + np.exp(y) * (r * t + d * t_data)


def errors(inputs, op, result) -> list[Fraction]:
    """|result - exact| per element, exactly."""
    scale = Fraction(1, len(inputs)) if op == "avg" else 1
    return [abs(Fraction(float(result[i])) - scale * sum(Fraction(float(x[i])) for x in inputs))
            for i in range(result.size)]


def through(codec, x):
    """``x`` rounded through ``codec``'s wire type (a new array)."""
    wire = np.empty(x.size, codec.wire_dtype)
    codec.encode(x, wire)
    back = np.empty_like(x)
    codec.decode(wire, back)
    return back


def ring_model(inputs, op, codec):
    """What the ring all-reduce computes with ``codec`` (None: uncompressed) over ``inputs`` (one
    flat array per rank, float32 or float64), element for element: chunk c (``chunk_bounds``)
    starts on rank c + 1 and picks up ranks c + 2, ..., c in turn. Each hop rounds the partial sum
    through the wire type (it is encoded to be sent) and adds the next rank's contribution exactly
    as that rank holds it, in the data's dtype; "avg" divides each contribution by n first over a
    float16 wire, else the finished sum once; the owner then rounds the finished chunk."""
    n, count = len(inputs), inputs[0].size
    hop = (lambda v: v) if codec is None else (lambda v: through(codec, v))
    prescale = op == "avg" and codec is not None and codec.narrow_range
    if prescale:
        inputs = [np.true_divide(x, n, out=np.empty_like(x)) for x in inputs]
    out = np.empty(count, inputs[0].dtype)
    for c, (start, stop) in enumerate(chunk_bounds(count, n)):
        acc = inputs[(c + 1) % n][start:stop].copy()
        for j in range(2, n + 1):
            acc = hop(acc) + inputs[(c + j) % n][start:stop]
        if op == "avg" and not prescale and n > 1:
            np.true_divide(acc, n, out=acc, casting="unsafe")
        out[start:stop] = hop(acc)
    return out
