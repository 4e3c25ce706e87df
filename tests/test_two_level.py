"""Tier 2: the hierarchical (two-level) all-reduce: simulated hosts as threads (in one process), then real worlds
with declared hosts (COLLECTIVES_HOSTS) against the flat ring and MPI, and its settings' errors."""
import numpy as np
import pytest

from ring import algorithms
from tests.support.simulated import BOUND, simulate_hosts
from tests.support.simulated import reference
from tests.worlds import run_world


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (2, 3), (3, 2), (4, 2), (2, 4)])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("count", [1, 5, 1001])
def test_two_levels_give_every_rank_the_reduction(hosts, per_host, op, count):
    n = hosts * per_host
    dtype = np.float64
    inputs = [((np.arange(count) * 7 + r * 13) % 11 + 1).astype(dtype) for r in range(n)]

    def body(local, across, rank):
        out = np.empty(count, dtype)
        algorithms.allreduce_two_level(local, across, BOUND, inputs[rank].copy(), out, op, segment_elems=64)
        return out

    results = simulate_hosts(hosts, per_host, body)
    expected = reference(inputs, op)
    assert all(r.tobytes() == results[0].tobytes() for r in results), "ranks differ"
    np.testing.assert_allclose(results[0], expected, rtol=1e-12)


def test_two_levels_in_place_float16_avg_stays_in_range():
    """float16 "avg" pre-scales at both levels: 4 ranks of 30000 average to about 30000, not inf."""
    def body(local, across, rank):
        x = np.full(10, 30000, np.float16)
        algorithms.allreduce_two_level(local, across, BOUND, x, x, "avg", segment_elems=4)
        return x

    for result in simulate_hosts(2, 2, body):
        assert np.all(np.isfinite(result)) and np.allclose(result, 30000, rtol=1e-2)


def _run(n: int, path, **env):
    result = run_world(n, ["-m", "tests.programs.two_level", str(path)], 120, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.count("close to MPI, identical on every rank") == 5 * n, result.stdout[-3000:]
    return result.stdout


@pytest.mark.parametrize("n, hosts", [(4, 2), (6, 2), (6, 3)])
def test_declared_hosts_take_two_levels_and_agree_with_the_flat_ring(n, hosts, tmp_path):
    two = _run(n, tmp_path / "two.npz", COLLECTIVES_HOSTS=str(hosts))
    flat = _run(n, tmp_path / "flat.npz", COLLECTIVES_HOSTS=str(hosts), COLLECTIVES_ALGORITHM="ring")
    assert f"rank 0: two levels: {n // hosts} ranks per host, {hosts} hosts" in two, two
    assert two.count("reversed group: close to MPI, identical on every rank, two levels") == n, two
    assert "rank 0: the flat ring" in flat, flat
    ours, ring = np.load(tmp_path / "two.npz"), np.load(tmp_path / "flat.npz")
    for name in ("int64_sum", "float32_max"):   # exact whatever the order
        assert np.array_equal(ours[name], ring[name]), name
    for name in ("float32_sum", "float64_avg"):   # the same sums, added in another order
        np.testing.assert_allclose(ours[name], ring[name], rtol=1e-5, atol=1e-5)


def test_uneven_hosts_keep_the_flat_ring(tmp_path):
    assert "rank 0: the flat ring" in _run(5, tmp_path / "x.npz", COLLECTIVES_HOSTS="2")


@pytest.mark.parametrize("env, message", [
    ({"COLLECTIVES_ALGORITHM": "hierarchical"},
     "init: COLLECTIVES_ALGORITHM / algorithm: 'hierarchical' needs ranks on several hosts, the same number "
     "(more than one) on each, but all ranks are on one host"),
    ({"COLLECTIVES_HOSTS": "3"}, "init: COLLECTIVES_HOSTS / hosts: 3 hosts, but the world has only 2 rank(s)"),
    ({"COLLECTIVES_ALGORITHM": "tree"},
     "init: COLLECTIVES_ALGORITHM: expected 'auto' or 'ring' or 'halving' or 'doubling' or 'hierarchical', got 'tree'"),
])
def test_a_layout_the_algorithm_cannot_use_is_refused_on_every_rank(env, message, tmp_path):
    result = run_world(2, ["-m", "tests.programs.two_level", str(tmp_path / "x.npz")], 60, env=env)
    assert result.returncode != 0 and result.stdout.count(message) == 2, result.stdout[-3000:]
