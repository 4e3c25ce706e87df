"""Tier 1: the recursive-doubling schedule and the cross-rank check, without MPI."""
import threading

import numpy as np
import pytest

from collectives.calls.signature import disagreement, signature
from ring import arrays
from ring.doubling import agree, doubling_steps
from ring.transport.inprocess import InProcessWorld
from ring.transport.base import unbounded

BOUND = unbounded()   # (the simulated world has its own timeout)


@pytest.mark.parametrize("n", range(1, 10))
def test_every_send_meets_a_receive_in_the_same_order(n):
    sends = {(r, s.send_to) for r in range(n) for s in doubling_steps(r, n) if s.send_to is not None}
    recvs = {(s.recv_from, r) for r in range(n) for s in doubling_steps(r, n) if s.recv_from is not None}
    assert sends == recvs
    for r in range(n):
        for step in doubling_steps(r, n):
            if step.merge in ("mine_first", "theirs_first") and step.send_to == step.recv_from:
                assert (step.merge == "mine_first") == (r < step.recv_from)


def _run(n, signatures, payloads=None, op="sum"):
    world = InProcessWorld(n, timeout=10)
    results, outs = [None] * n, [None] * n

    def rank(r):
        payload = None if payloads is None else payloads[r]
        out = None if payload is None else np.full_like(payload, -1)
        results[r] = agree(world.transport(r), BOUND, signatures[r], payload, arrays.ufunc(np, op), out)
        outs[r] = out

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results, outs


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_agreeing_ranks_reduce_the_payload_to_the_same_bits(n, op):
    rng = np.random.default_rng(n)
    payloads = [rng.standard_normal(37) for _ in range(n)]
    results, outs = _run(n, [b"same"] * n, payloads, op)
    assert all(results)
    expected = {"sum": np.sum, "max": np.max, "prod": np.prod}[op](np.stack(payloads), axis=0)
    np.testing.assert_allclose(outs[0], expected, rtol=1e-12)
    assert all(o.tobytes() == outs[0].tobytes() for o in outs), "ranks differ in some bit"


@pytest.mark.parametrize("n", range(2, 10))
def test_one_odd_signature_is_seen_by_every_rank_and_nothing_is_written(n):
    for odd in {0, n // 2, n - 1}:
        signatures = [b"odd" if r == odd else b"same" for r in range(n)]
        results, outs = _run(n, signatures, [np.ones(5) for _ in range(n)])
        assert results == [False] * n
        assert all(np.all(o == -1) for o in outs)


def test_disagreement_names_the_argument_and_the_ranks():
    a = signature("broadcast", 3, dtype=np.dtype("int8"), shape=(4,), root=0)
    b = signature("broadcast", 3, dtype=np.dtype("int8"), shape=(4,), root=2)
    assert disagreement("broadcast", [a, b, a]) == "broadcast: root: root differs across ranks: rank 0: 0, rank 1: 2"
    c = signature("allreduce", 3, op="sum", dtype=np.dtype("float32"), shape=(4,))
    assert "collective differs across ranks: rank 0: broadcast, rank 1: allreduce" in disagreement("broadcast", [a, c])
    main, named_main = (signature("allreduce", 3, "sum", np.dtype("float32"), (4,), thread=t) for t in ("", "MainThread"))
    assert disagreement("allreduce", [main, named_main]) == \
        "allreduce: calling thread differs across ranks: rank 0: the main thread, rank 1: thread 'MainThread'"
    long_shape = signature("allreduce", 1, "sum", np.dtype("float32"), (1,) * 200)
    assert len(long_shape) <= 128
