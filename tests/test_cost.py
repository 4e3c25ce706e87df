"""Tier 1: the cost model (ring.cost), its fit (bench.model) and the runtime's choice by it."""
import argparse

import numpy as np
import pytest

from bench.model import fit, parse_hosts, parse_link
from collectives.calls.runtime import Runtime
from collectives.calls.config import defaults
from ring import cost

TRUE = cost.Costs(call=20e-6, alpha=4e-6, beta=0.25e-9, gamma=0.15e-9)


def _rows(costs, noise=0.0, seed=0):
    """Timings an ideal machine with ``costs`` would give (times ``1 + noise * N(0, 1)``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (2, 3, 4):
        for op, algorithms in cost.ALGORITHMS.items():
            for algorithm in algorithms:
                for nbytes in (8, 4096, 65536, 1 << 20, 16 << 20):
                    if algorithm not in cost.candidates(op, nbytes):
                        continue
                    t = cost.predict(op, algorithm, n, nbytes, costs) * (1 + noise * rng.standard_normal())
                    rows.append({"n": n, "op": op, "algorithm": algorithm, "bytes": nbytes, "seconds": t})
    return rows


def test_the_fit_recovers_the_costs_that_made_the_timings():
    fitted = fit(_rows(TRUE), 4 << 20, True)
    for name in ("call", "alpha", "beta", "gamma"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


def test_the_fit_is_close_under_noise_and_never_negative():
    fitted = fit(_rows(TRUE, noise=0.1, seed=3), 4 << 20, True)
    assert min(fitted.call, fitted.alpha, fitted.beta, fitted.gamma) >= 0
    assert fitted.beta == pytest.approx(TRUE.beta, rel=0.25)
    assert fitted.call + fitted.alpha == pytest.approx(TRUE.call + TRUE.alpha, rel=0.25)


LATENCY_ONLY, BANDWIDTH_ONLY = cost.Costs(0, 1, 0, 0), cost.Costs(0, 0, 1, 0)


@pytest.mark.parametrize("costs, n, nbytes, expected", [
    # Only messages cost: the fewest messages win (counts from the module's table, check on, s = doubling steps).
    (LATENCY_ONLY, 4, 8, "doubling"),          # doubling s=2; halving 2 + 2*2 = 6; ring 2 + 2*3 = 8
    (LATENCY_ONLY, 5, 8, "doubling"),          # doubling s=4; halving 4 + fold 2 + 2*2 = 10; ring 4 + 2*4 = 12
    (LATENCY_ONLY, 5, 1 << 20, "halving"),     # above doubling's buffer: halving 10 against the ring's 12
    (LATENCY_ONLY, 2, 1 << 20, "halving"),     # 1 + 2 each: the tie goes to halving, listed before the ring
    # Only bytes sent cost: the fewest bytes win.
    (BANDWIDTH_ONLY, 3, 1 << 20, "ring"),      # ring 2(n-1)/n N = 4/3 N; halving (p=2) N + fold 2N = 3N
    (BANDWIDTH_ONLY, 4, 1 << 20, "halving"),   # both 3/2 N: the tie to halving
    (BANDWIDTH_ONLY, 5, 64 << 20, "ring"),     # ring 8/5 N; halving 3/2 N + 2N
    (BANDWIDTH_ONLY, 2, 8, "doubling"),        # every one sends N: the tie to doubling, listed first
    (TRUE, 1, 8, "doubling"), (TRUE, 1, 1 << 20, "halving"),   # one rank: only copies; ties, doubling if it may
])
def test_choose_takes_the_cheapest_by_the_counts_of_the_table(costs, n, nbytes, expected):
    assert cost.choose("allreduce", n, nbytes, costs) == expected


def test_latency_then_bandwidth():
    """Small calls go to recursive doubling, large ones to a bandwidth-optimal algorithm; the ring's
    2(n-1) messages lose to Rabenseifner's 2 log2(n) at scale below its pipelined sizes."""
    assert cost.choose("allreduce", 4, 8, TRUE) == "doubling"
    assert cost.choose("allreduce", 2, 256 << 20, TRUE) == "ring"
    assert cost.choose("allreduce", 1024, 1 << 20, TRUE) == "halving"
    assert cost.choose("allreduce", 4, 1 << 20, TRUE, doubling_bytes=0) != "doubling"


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (3, 2), (8, 8), (4, 3)])
def test_a_host_link_carries_what_each_algorithm_sends_across_it(hosts, per_host):
    """With free hosts and a network that only moves bytes, the time is the busiest host link's
    bytes: the flat ring's 2(n-1)/n N (one rank per host talks to the next host), two levels'
    2(H-1)/H N (L all-reduces of N/L share the link), Rabenseifner's every step between hosts
    times the ranks of a host that take it together (docs/hosts.md
    compares these with measurements on 2 x 2 emulated hosts)."""
    n, nbytes = hosts * per_host, 48 << 20
    free, network = cost.Costs(0, 0, 0, 0), cost.Costs(0, 0, 1e-9, 0)
    flat = cost.predict("allreduce", "ring", n, nbytes, free, hosts=(hosts, per_host), network=network)
    two = cost.predict("allreduce", "two-level", n, nbytes, free, hosts=(hosts, per_host), network=network)
    assert flat == pytest.approx(2 * (n - 1) / n * nbytes * 1e-9)
    best_across = min(cost.terms("allreduce", a, hosts, nbytes // per_host, check=False).moved
                      for a in cost.candidates("allreduce", nbytes // per_host))
    assert two == pytest.approx(best_across * per_host * 1e-9)
    if hosts & (hosts - 1) == 0:   # (a power of two: halving among the hosts moves the ring's bytes)
        assert two == pytest.approx(2 * (hosts - 1) / hosts * nbytes * 1e-9)


def test_halving_on_two_hosts_sends_both_ranks_halves_across():
    free, network = cost.Costs(0, 0, 0, 0), cost.Costs(0, 0, 1e-9, 0)
    halving = cost.predict("allreduce", "halving", 4, 1 << 20, free, hosts=(2, 2), network=network)
    assert halving == pytest.approx(2 * (1 << 20) * 1e-9)   # d=2 both ways, 2 ranks x N/2 on one link


def test_two_levels_win_where_the_network_is_slow_and_lose_where_it_is_not():
    """On 2 hosts of 2 the flat ring sends 2(n-1)/n N = 1.5 N across a host link, two levels
    2(H-1)/H N = N: a slow network makes two levels about 1.5 times faster (less their local steps);
    a network as fast as the host leaves them only their extra local steps, and the flat ring wins."""
    def flat_over_two(network):
        flat = cost.predict("allreduce", "ring", 4, 16 << 20, TRUE, hosts=(2, 2), network=network)
        return flat / cost.predict("allreduce", "two-level", 4, 16 << 20, TRUE, hosts=(2, 2), network=network)

    assert 1.3 < flat_over_two(cost.Costs(0, 50e-6, 8e-9, 0)) < 1.5   # 125 MB/s, 30 times slower than the host
    assert flat_over_two(cost.Costs(0, 0, 1, 0)) == pytest.approx(1.5, rel=1e-6)   # only the network costs
    assert flat_over_two(TRUE) < 1


@pytest.mark.parametrize("setting, size, expected", [
    ("auto", 64, "doubling"), ("auto", 64 << 20, "ring"), ("ring", 64, "ring"), ("halving", 64, "halving"),
    ("doubling", 64, "doubling"), ("doubling", 1 << 20, "ring"), ("hierarchical", 64, "doubling"),
])
def test_the_runtime_forces_or_asks_the_model(setting, size, expected):
    runtime = Runtime(defaults(segment_bytes=4 << 20, small_bytes=256 << 10, timeout=5.0, algorithm=setting))
    assert runtime.algorithm_for("allreduce", 2, size) == expected
    assert runtime.algorithm_for("allreduce", 2, size, host=False) == "ring"   # GPU arrays: the ring


def test_small_bytes_zero_turns_doubling_off():
    runtime = Runtime(defaults(segment_bytes=4 << 20, small_bytes=0, timeout=5.0))
    assert runtime.algorithm_for("allreduce", 2, 8) != "doubling"
    assert runtime.algorithm_for("allgather", 2, 8) == "ring"


@pytest.mark.parametrize("text", ["25GB/s", "fast,5us", "0GB/s,5us", "25GB/s,5"])
def test_a_bad_link_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="25GB/s,5us"):
        parse_link(text)


def test_links_and_hosts_parse():
    assert parse_link("100MB/s, 2ms") == cost.Costs(0, 2e-3, 1e-8, 0)
    assert parse_hosts("4x2") == (4, 2)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_hosts("0x8")


def test_on_two_ranks_the_runtime_prices_a_collective_with_lanes_as_its_lanes_run():
    """Every algorithm of the all-reduce has an express lane on two ranks, whose messages cost a third of
    the usual way's: there the choice follows ``cost.LANES`` (halving from 64 KiB), elsewhere, and for
    what no lane carries (compressed, a reduce-scatter, more ranks, past a segment), ``cost.MEASURED``."""
    runtime = Runtime(defaults(segment_bytes=4 << 20, timeout=5.0))
    by = {name: cost.choose("allreduce", 2, 64 << 10, costs) for name, costs in
          (("lanes", cost.LANES), ("measured", cost.MEASURED))}
    assert by == {"lanes": "halving", "measured": "doubling"}    # (the two prices disagree at 64 KiB)
    assert runtime.algorithm_for("allreduce", 2, 64 << 10) == "halving"
    assert runtime.algorithm_for("allreduce", 2, 64 << 10, wire_ratio=0.5) == \
        cost.choose("allreduce", 2, 64 << 10, cost.MEASURED, wire_ratio=0.5)
    for n in (3, 4):
        assert runtime.algorithm_for("allreduce", n, 64 << 10) == cost.choose("allreduce", n, 64 << 10)
    assert runtime.algorithm_for("reduce_scatter", 2, 64 << 10) == cost.choose("reduce_scatter", 2, 64 << 10)
    small = Runtime(defaults(segment_bytes=16 << 10, timeout=5.0))   # (past a segment: no lane)
    assert small.algorithm_for("allreduce", 2, 64 << 10) == cost.choose("allreduce", 2, 64 << 10,
                                                                       segment_bytes=16 << 10)


def test_on_two_ranks_the_all_gather_keeps_the_doubling_to_16_kib_a_rank_as_measured():
    """The all-gather's ring waits for every rank's counts before its one message (a round of its own,
    ``Terms.rounds``); the doubling's one message carries counts and rows, on two ranks its sender's rows
    alone, copied into the message and out. In a lane the ring's round is its message alone: the lane's
    one function makes it (``collectives.ops.fused``; ``Costs.round``). Measured on the 2-core Xeon
    (2026-11-30 night, n=2, forced in turn, tight loop, a lane each, the one function for both): the
    doubling 9.4 / 21.6 / 29.3 / 37.8 us, the ring 13.8 / 20.2 / 22.4 / 25.0 us at 8 B / 16 / 32 / 64 KiB
    a rank (before the ring's lane ran as one function: the ring 22.5 / 23.8 / 30.8 / 35.4 us, and the
    model priced the round as a call, the doubling to 32 KiB a rank)."""
    runtime = Runtime(defaults(segment_bytes=4 << 20, timeout=5.0))
    per_rank = (8, 16 << 10, 32 << 10, 64 << 10)
    chosen = [runtime.algorithm_for("allgather", 2, 2 * nbytes) for nbytes in per_rank]
    assert chosen == ["doubling", "doubling", "ring", "ring"]
    usual = [cost.choose("allgather", 2, 2 * nbytes, cost.MEASURED) for nbytes in per_rank]   # (a round: a call)
    assert usual[2] == "doubling"
    assert cost.terms("allgather", "doubling", 2, 2 * 64 << 10).moved == 64 << 10   # (one rank's rows)
