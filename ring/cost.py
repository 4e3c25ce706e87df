"""The cost model: how long each algorithm takes, and so which one a call should use.

Every algorithm's time is a sum over what it does on its slowest path::

    time = call * (1 + rounds) + alpha * messages + beta * bytes moved + gamma * bytes reduced

``call`` is the fixed cost of one call (Python: validation, the frame, the cross-rank
check's bookkeeping), paid once more for each round the call waits through before its data
moves (``rounds``: only the all-gather's ring, below), ``alpha`` the cost of one message
(latency and software), ``beta`` seconds per byte a rank sends, ``gamma`` seconds per byte combined (or copied). The
counts come from the schedules (``ring.schedule``, ``ring.doubling``); the four numbers
are measured: ``python -m bench --model`` fits them to a sweep of every algorithm and
prints how well they predict it. The runtime picks, per call, the algorithm with the least
predicted time (:func:`choose`): the same formulas the bench prints, so one source of truth.

Counts for one rank of n (p = the largest power of two <= n, s = doubling steps =
log2(p) plus 2 when n > p, N = bytes, k = segments per message, check = s header-only
messages when the cross-rank check is on; "doubling" carries the check itself):

==============  ======================  ==========================  ============================
algorithm       messages                bytes moved                 bytes reduced
==============  ======================  ==========================  ============================
doubling        s                       s N                         (log2 p + [n > p] + 1) N
ring            check + 2(n-1) k        2(n-1)/n N                  (n-1)/n N / k
halving         check + 2 log2(p) k     2(p-1)/p N + [n > p] 2N     (p-1)/p N + [n > p] N
  (Rabenseifner: recursive halving, then doubling)
==============  ======================  ==========================  ============================

Doubling counts the same for every collective (all-gather and broadcast combine by
bitwise or where all-reduce reduces), but the all-gather on two ranks, whose message is its
sender's own rows (N/2 moved; copied into the message, then both halves into the result: 3N/2).
The ``+ 1`` of doubling is its copies into and out of the message; the ring's ``/ k`` is its
pipeline (it reduces one segment while the next one moves; the others run in lockstep). The
all-gather's ring waits for every rank's row counts (one doubling exchange) before its first
message: a round of its own, priced as one call more the usual way, and as its message alone in an
express lane, whose one function makes it (``Costs.round``; on two ranks, measured in a tight loop:
the doubling ahead at 8 B a rank, 9.4 us against the ring's 13.8, even at 16 KiB, the ring ahead
from 32 KiB, 22.4 against 29.3). Two levels (H hosts of L ranks) add a local
reduce-scatter and all-gather (the ring on L ranks, local link) to an all-reduce of N/L
across hosts (network link).

A compressed all-reduce (``compression=``, ``ring.compression``) is told by ``wire_ratio``, the
wire's bytes per byte of data (1/2 for float32 as bfloat16 or float16, 1/4 for float64): the
ring and halving send ``wire_ratio`` times the bytes above, and count every byte of data they send
or receive once more as reduced (its encoding or decoding), and the owner's chunk twice (its
rounding); recursive doubling, which runs uncompressed, is counted as it is. Two levels
compress only across hosts. On one host's memory the codec costs more than the bytes it saves:

>>> costs = Costs(call=10e-6, alpha=2e-6, beta=0.3e-9, gamma=0.2e-9)
>>> compressed = predict("allreduce", "ring", 4, 64 << 20, costs, wire_ratio=0.5)
>>> round(compressed / predict("allreduce", "ring", 4, 64 << 20, costs), 2)
1.97
>>> network = Costs(0, 50e-6, 8e-9, 1e-10)      # 125 MB/s between hosts: there it pays
>>> plain = predict("allreduce", "two-level", 4, 16 << 20, costs, hosts=(2, 2), network=network)
>>> round(plain / predict("allreduce", "two-level", 4, 16 << 20, costs, hosts=(2, 2), network=network, wire_ratio=0.5), 2)
1.78

>>> costs = Costs(call=10e-6, alpha=2e-6, beta=0.3e-9, gamma=0.2e-9)
>>> choose("allreduce", 2, 1024, costs), choose("allreduce", 2, 64 << 20, costs)
('doubling', 'ring')
>>> choose("allreduce", 64, 256 << 10, costs)
'halving'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ring import doubling
from ring.schedule import core_size

#: The algorithms of each collective, in the order ties are broken. At n=1 every one moves nothing:
#: recursive doubling, which builds no plan, has the fewest calls. At n=2 halving and the ring send
#: the same messages; halving's lockstep exchanges measured 0-8% faster from 128 KiB to 2 MiB.
ALGORITHMS = {
    "allreduce": ("doubling", "halving", "ring"),
    "reduce_scatter": ("doubling", "ring"),
    "allgather": ("doubling", "ring"),
    "broadcast": ("doubling", "ring"),
}
#: The largest message of the doubling algorithms (their message buffer).
DOUBLING_MAX_BYTES = doubling.MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class Costs:
    """Seconds per call, per message, per byte moved and per byte reduced (see the module), and per
    round a call waits through before its data moves (``Terms.rounds``), beyond that round's messages:
    None prices it as a call (the usual way: the all-gather's ring makes a call of the doubling for its
    counts), 0 where the round is a message inside the call's own function (an express lane's).

    >>> usual, lane = Costs(10e-6, 2e-6, 0, 0), Costs(10e-6, 2e-6, 0, 0, round=0)   # (us below)
    >>> [round(costs.time(Terms(messages=2, moved=0, reduced=0, rounds=1)) * 1e6, 1) for costs in (usual, lane)]
    [24.0, 14.0]
    """
    call: float
    alpha: float
    beta: float
    gamma: float
    round: float | None = None

    def time(self, terms: "Terms") -> float:
        per_round = self.call if self.round is None else self.round
        return (self.call + per_round * terms.rounds + self.alpha * terms.messages + self.beta * terms.moved
                + self.gamma * terms.reduced)


#: Fitted on the 2-core development machine, n = 2, float32 sum, every algorithm of every
#: collective from 8 B to 64 MiB: ``mpiexec -n 2 python -m bench --model`` (docs/algorithms.md, "Cost model").
#: ``call`` and ``alpha`` are mostly Python (one mpi4py exchange alone takes about 4 us here).
MEASURED = Costs(call=34.5e-6, alpha=10.8e-6, beta=0.250e-9, gamma=0.167e-9)   # medians of 3 fits
#: What a call costs where an express lane carries it (``collectives.ops.express``: a repeated
#: blocking call; on two ranks every algorithm of the all-reduce, all-gather and broadcast has one, up
#: to a segment): the same fit on the timings of those calls alone, which ``--model`` prints apart
#: (medians of 3 fits, the same machine, 2026-11-29). Its ``alpha`` is a third of the usual way's, so
#: on two ranks halving takes the all-reduce over from 64 KiB, not 128. A lane's round costs its
#: message alone: the all-gather's counts go inside the lane's one function (``collectives.ops.fused``),
#: so on two ranks the ring's direct rows take over from the doubling's copies at 22 KiB a rank.
LANES = Costs(call=5.63e-6, alpha=3.93e-6, beta=0.126e-9, gamma=0.090e-9, round=0.0)


class Terms(NamedTuple):
    """What one call does on its slowest rank: messages, bytes sent, bytes reduced (or copied), and
    ``rounds`` it waits through before its data moves, each priced as ``Costs.round`` says (the
    all-gather's ring, whose row counts come first)."""
    messages: float
    moved: float
    reduced: float
    rounds: float = 0

    def __add__(self, other):   # (a NamedTuple adds by concatenating)
        return Terms(self.messages + other.messages, self.moved + other.moved, self.reduced + other.reduced,
                     self.rounds + other.rounds)


def candidates(op: str, nbytes: int, doubling_bytes: int = DOUBLING_MAX_BYTES) -> tuple[str, ...]:
    """The algorithms of ``op`` that can carry ``nbytes``: recursive doubling only up to
    ``doubling_bytes`` (its message buffer, or the runtime's ``small_bytes``).

    >>> candidates("allreduce", 8), candidates("allreduce", 1 << 20)
    (('doubling', 'halving', 'ring'), ('halving', 'ring'))
    """
    return tuple(a for a in ALGORITHMS[op] if a != "doubling" or nbytes <= doubling_bytes)


def doubling_steps(n: int) -> int:
    """Messages of one recursive-doubling exchange on n ranks (on its busiest rank, 0).

    >>> [doubling_steps(n) for n in (1, 2, 3, 4, 5, 8)]
    [0, 1, 3, 2, 4, 3]
    """
    return len(doubling.doubling_steps(0, n))


def terms(op: str, algorithm: str, n: int, nbytes: int, segment_bytes: int = 4 << 20,
          check: bool = True, wire_ratio: float = 1.0) -> Terms:
    """The counts of the module's table for ``op`` by ``algorithm`` on ``n`` ranks of one host.

    ``nbytes`` is the buffer (allreduce, broadcast), the input (reduce_scatter) or the output
    (allgather). Before its ring, an all-gather spends one doubling exchange on the ranks'
    lengths (which carries the check); by doubling, the lengths travel with the data.
    ``wire_ratio`` < 1: a compressed all-reduce (see the module).

    >>> terms("allreduce", "ring", 4, 4096, check=False)
    Terms(messages=6, moved=6144.0, reduced=3072.0, rounds=0)
    >>> terms("allreduce", "ring", 4, 4096, check=False, wire_ratio=0.5)   # half the bytes; the codec's work
    Terms(messages=6, moved=3072.0, reduced=17408.0, rounds=0)
    >>> terms("allgather", "ring", 2, 4096)        # the counts first, a round of their own
    Terms(messages=2, moved=2048.0, reduced=2048.0, rounds=1)
    >>> terms("allgather", "doubling", 2, 4096)    # one message: its sender's counts and rows
    Terms(messages=1, moved=2048.0, reduced=6144.0, rounds=0)
    """
    counted = _terms(op, algorithm, n, nbytes, segment_bytes, check)
    if wire_ratio == 1.0 or algorithm == "doubling" or n == 1:
        return counted
    # every byte sent was encoded and every byte received decoded; the owner rounds its chunk
    codec = 2 * counted.moved + 2 * nbytes / n
    return Terms(counted.messages, counted.moved * wire_ratio, counted.reduced + codec, counted.rounds)


def _terms(op: str, algorithm: str, n: int, nbytes: int, segment_bytes: int, check: bool) -> Terms:
    if n == 1:   # one copy into the result, whatever the algorithm (ties then go to recursive doubling)
        return Terms(0, 0, nbytes)
    p = core_size(n)
    log_p = p.bit_length() - 1
    folded = n > p
    s = doubling_steps(n)
    checking = Terms(s if check or op == "allgather" else 0, 0, 0)   # (an all-gather's lengths, always)
    segments = max(1, math.ceil(nbytes / n / segment_bytes))
    if algorithm == "doubling":
        if op == "allgather" and n == 2:   # (its sender's rows alone: ``algorithms.allgather_message``)
            return Terms(1, nbytes / 2, 3 * nbytes / 2)
        return Terms(s, s * nbytes, (log_p + folded + 1) * nbytes)
    if algorithm == "halving":
        fold = Terms(2 * math.ceil(nbytes / segment_bytes), 2 * nbytes, nbytes) if folded else Terms(0, 0, 0)
        return checking + fold + Terms(2 * log_p * segments, 2 * (p - 1) / p * nbytes, (p - 1) / p * nbytes)
    if algorithm != "ring":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    share = (n - 1) / n * nbytes
    exposed = share / segments   # the ring reduces one segment while the next moves: one in k shows
    if op == "allreduce":
        return checking + Terms(2 * (n - 1) * segments, 2 * share, exposed)
    if op == "reduce_scatter":
        return checking + Terms((n - 1) * segments, share, exposed)
    if op == "allgather":
        return checking + Terms((n - 1) * segments, share, nbytes / n, rounds=1)   # (its own block, copied into place)
    if op == "broadcast":
        k = max(1, math.ceil(nbytes / segment_bytes))
        return checking + Terms(n - 2 + k, (n - 2 + k) * nbytes / k, 0)
    raise ValueError(f"unknown collective {op!r}")


def predict(op: str, algorithm: str, n: int, nbytes: int, costs: Costs = MEASURED, *,
            segment_bytes: int = 4 << 20, check: bool = True, hosts: tuple[int, int] | None = None,
            network: Costs | None = None, wire_ratio: float = 1.0) -> float:
    """Predicted seconds of one call. ``hosts=(H, L)``: n = H*L ranks on H hosts of L, consecutive
    ranks on each, where ``network`` (default ``costs``) prices what crosses hosts, on one link per
    host that the host's ranks share. A flat algorithm's messages then pay the network's latency
    and its bytes the busiest host link's time: the ring sends one rank's bytes across each link
    at every step (consecutive ranks: one rank per host talks to the next host), halving sends
    L ranks' bytes across at its steps between hosts (:func:`crossing`). ``algorithm="two-level"``
    keeps the network to L concurrent all-reduces of N/L among H ranks (one per place on a host,
    all on the same links; by whichever flat algorithm is fastest there), so a host link
    carries 2(H-1)/H N where the flat ring's carries 2(n-1)/n N. ``wire_ratio``: see the module.

    >>> host = Costs(0, 1e-6, 1e-10, 1e-10); network = Costs(0, 50e-6, 8e-9, 1e-10)   # 125 MB/s
    >>> flat = predict("allreduce", "ring", 4, 16 << 20, host, hosts=(2, 2), network=network)
    >>> two = predict("allreduce", "two-level", 4, 16 << 20, host, hosts=(2, 2), network=network)
    >>> round(flat / two, 2)      # about 2(n-1)/n / 2(H-1)/H = 1.5, less the local steps
    1.48
    """
    network = network or costs
    if hosts is None or hosts[0] == 1:
        return costs.time(terms(op, algorithm, n, nbytes, segment_bytes, check, wire_ratio))
    count, per_host = hosts
    if algorithm in ("halving", "doubling") and op == "allreduce":
        counted = terms(op, algorithm, n, nbytes, segment_bytes, check, wire_ratio)
        shrink = 1.0 if algorithm == "doubling" else wire_ratio
        moved = shrink * sum(sent * (network.beta * across if across else costs.beta)
                             for sent, across in crossing(algorithm, n, per_host, nbytes))
        return costs.call + network.alpha * counted.messages + moved + costs.gamma * counted.reduced
    if algorithm != "two-level":
        link = Costs(costs.call, network.alpha, network.beta, costs.gamma)
        return link.time(terms(op, algorithm, n, nbytes, segment_bytes, check, wire_ratio))
    local = Terms(2 * (per_host - 1), 2 * (per_host - 1) / per_host * nbytes, (per_host - 1) / per_host * nbytes)
    chunk = math.ceil(nbytes / per_host)
    shared = Costs(0.0, network.alpha, network.beta * per_host, costs.gamma)   # L all-reduces on one link
    best_across = min(shared.time(terms("allreduce", a, count, chunk, segment_bytes, check=False, wire_ratio=wire_ratio))
                      for a in candidates("allreduce", chunk))
    checking = Terms(doubling_steps(n) if check else 0, 0, 0)
    return costs.time(local + checking) + best_across


def crossing(algorithm: str, n: int, per_host: int, nbytes: int) -> list[tuple[float, int]]:
    """An all-reduce by ``algorithm`` ("halving": Rabenseifner's, or "doubling") on ``n`` ranks,
    ``per_host`` consecutive ranks on each host, step by step: (the bytes a rank sends, how many
    ranks of the busiest host send theirs to another host at once; 0: the step stays on every
    host). The p core ranks pair at distances p/2 .. 1 then 1 .. p/2 (halving, sending d/p of
    the buffer: ``ring.schedule.halving_plans``) or 1 .. p/2 (doubling, the whole buffer:
    ``ring.doubling``); the ranks past p fold in first and out last.

    >>> crossing("halving", 4, 2, 1024)      # 2 x 2: the halves cross, the quarters stay on the host
    [(512.0, 2), (256.0, 0), (256.0, 0), (512.0, 2)]
    >>> crossing("doubling", 4, 2, 1024)
    [(1024.0, 0), (1024.0, 2)]
    """
    p = core_size(n)
    host = [r // per_host for r in range(n)]

    def busiest(pairs: list[tuple[int, int]]) -> int:
        leaving = [0] * (host[-1] + 1)
        for sender, receiver in pairs:
            if host[sender] != host[receiver]:
                leaving[host[sender]] += 1
        return max(leaving)

    def paired(sent: float, distance: int) -> tuple[float, int]:
        return sent, busiest([(r, r ^ distance) for r in range(p)])

    up = _powers_down(p // 2)[::-1]
    if algorithm == "halving":
        core = [paired(nbytes * d / p, d) for d in up[::-1]] + [paired(nbytes * d / p, d) for d in up]
    else:
        core = [paired(float(nbytes), d) for d in up]
    fold = [(r, r - p) for r in range(p, n)]
    if not fold:
        return core
    return [(float(nbytes), busiest(fold))] + core + [(float(nbytes), busiest([(b, a) for a, b in fold]))]


def _powers_down(top: int) -> list[int]:
    return [top >> k for k in range(top.bit_length())] if top else []


def choose(op: str, n: int, nbytes: int, costs: Costs = MEASURED, *, segment_bytes: int = 4 << 20,
           check: bool = True, doubling_bytes: int = DOUBLING_MAX_BYTES, wire_ratio: float = 1.0) -> str:
    """The algorithm with the least predicted time for ``op`` on ``n`` ranks and ``nbytes``
    (ties go to the earlier in ``ALGORITHMS``), among its ``candidates``; ``wire_ratio``: a compressed
    all-reduce's bytes on the wire per byte of data (see the module)."""
    best, best_time = "", math.inf
    for algorithm in candidates(op, nbytes, doubling_bytes):
        t = predict(op, algorithm, n, nbytes, costs, segment_bytes=segment_bytes, check=check, wire_ratio=wire_ratio)
        if t < best_time:
            best, best_time = algorithm, t
    return best


def reproducible(n: int, nbytes: int, itemsize: int = 4, words: int = 1, costs: Costs = MEASURED,
                 contributions: int | None = None) -> float:
    """Predicted seconds of ``allreduce(x, reproducible=True)`` of ``nbytes`` of data (``itemsize``
    bytes an element) on ``n`` ranks holding ``contributions`` in all (None: one each), whose grid
    takes ``words`` words of 8 bytes an element (``ring.reproducible``). Two contributions or
    fewer take the plain all-reduce after an outline of the data (one read) and its small exchange
    (``one_rounding``). Otherwise every rank's facts go in a small exchange (after an outline's on
    one or two ranks), then the words all-reduce: by the ring, their reduce-scatter (``8 * words /
    itemsize`` times the data's bytes), each rank's chunk decoded, and the all-gather of the
    data's bytes; or whole by the fastest algorithm, and every element decoded. The codec's passes
    count as bytes reduced: the facts read the data, the encoding reads it and writes the words,
    the decoding reads words and writes data.

    >>> costs = Costs(call=10e-6, alpha=2e-6, beta=0.3e-9, gamma=0.2e-9)
    >>> plain = predict("allreduce", choose("allreduce", 2, 64 << 20, costs), 2, 64 << 20, costs)
    >>> round(reproducible(2, 64 << 20, costs=costs) / plain, 1)   # one contribution on each: one rounding
    1.6
    >>> round(reproducible(2, 64 << 20, contributions=4, costs=costs) / plain, 1)   # the grid: the codec costs most
    6.0
    """
    exchange = predict("allreduce", "doubling", n, 32 * n, costs)
    outline = exchange + costs.gamma * nbytes if n <= 2 and itemsize >= 4 else 0.0
    if (n if contributions is None else contributions) <= 2:
        return outline + min(predict("allreduce", a, n, nbytes, costs) for a in candidates("allreduce", nbytes))
    wide = nbytes * 8 * words // itemsize
    ring = (predict("reduce_scatter", "ring", n, wide, costs) + predict("allgather", "ring", n, nbytes, costs)
            + costs.gamma * (wide + nbytes) / n)
    whole = (min(predict("allreduce", a, n, wide, costs) for a in candidates("allreduce", wide))
             + costs.gamma * (wide + nbytes))
    return outline + exchange + min(ring, whole) + costs.gamma * (nbytes + nbytes + wide)
