"""The reproducible sum's arithmetic as the tests check it (ring/reproducible.py): exact sums in
fractions rounded once to a dtype, contributions dealt to simulated ranks, and what every rank of
an all-reduce with ``reproducible=True`` computes from them."""
from fractions import Fraction

import numpy as np

from ring import reproducible

#: The exponent from which a rounded value is infinite: 2**emax.
TOP = {"float16": 16, "bfloat16": 128, "float32": 128, "float64": 1024}


def nearest(q: Fraction, dtype: str) -> float:
    """``q`` rounded to ``dtype`` to nearest, ties to even, subnormals and overflow as IEEE says."""
    digits, lowest = reproducible.PRECISION[dtype]
    if q == 0:
        return 0.0
    size = abs(q)
    e = size.numerator.bit_length() - size.denominator.bit_length()
    e += 1 if Fraction(2) ** (e + 1) <= size else -1 if Fraction(2) ** e > size else 0
    unit = Fraction(2) ** max(e - digits + 1, lowest)
    n, rest = divmod(size, unit)
    n += 1 if rest > unit / 2 or (rest == unit / 2 and n % 2) else 0
    value = n * unit
    magnitude = float("inf") if value >= Fraction(2) ** TOP[dtype] else float(value)
    return magnitude if q > 0 else -magnitude


def dealt(contributions: list, ranks: int, way: int) -> list[list]:
    """The contributions dealt to ``ranks`` ranks: 0 round robin, 1 in blocks, 2 reversed, every
    rank at least one."""
    k = len(contributions)
    if way == 0:
        owner = [i % ranks for i in range(k)]
    elif way == 1:
        owner = [min(i * ranks // k, ranks - 1) for i in range(k)]
    else:
        owner = [(ranks - 1 - i) % ranks for i in range(k)]
    return [[c for c, o in zip(contributions, owner) if o == r] for r in range(ranks)]


def simulated(held: list[list], g: reproducible.Grid, op: str) -> np.ndarray:
    """``reduce_simulated`` on a given grid."""
    size = held[0][0].size
    total = None
    for h in held:   # (each rank's own words; their sum, in the wire's dtype, is the all-reduce)
        mine = np.empty((g.words, size), g.wire_dtype)
        reproducible.encode(h, g, mine)
        with np.errstate(invalid="ignore"):   # (inf + -inf: NaN, as the ring's sum gives it)
            total = mine if total is None else total + mine
    special = None
    if g.marked:
        special = np.zeros((2, size), np.uint8)
        for h in held:
            reproducible.marks(h, special)
    return reproducible.decode(total, g, special, op, np.empty(size, held[0][0].dtype))


def reduce_simulated(held: list[list], op: str = "sum") -> np.ndarray:
    """What every rank of an all-reduce with ``reproducible=True`` computes from ``held``."""
    every = np.stack([reproducible.facts(h) for h in held])
    return simulated(held, reproducible.grid(every, held[0][0].dtype), op)


def exact(contributions: list, element: int, dtype: str, op: str = "sum") -> float:
    total = sum(Fraction(float(c[element])) for c in contributions)
    if all(float(c[element]) == 0 and np.signbit(c[element]) for c in contributions):
        return -0.0   # (IEEE: -0 + -0 is -0; any other exact zero sum is +0)
    return nearest(total / (len(contributions) if op == "avg" else 1), dtype)
