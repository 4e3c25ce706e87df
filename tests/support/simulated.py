"""A world of n ranks as threads of one process (tier 1): run one body per simulated rank, on
in-process transports, and the rank-dependent inputs and references the simulated tests compare
with."""
import threading

import numpy as np

from ring import algorithms
from ring.transport.base import unbounded
from ring.transport.inprocess import InProcessWorld

BOUND = unbounded()   # (the simulated world has its own timeout)

REFERENCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def simulate(n, body):
    """Run ``body(transport)`` on n threads (one per rank); return each rank's result, re-raise any error."""
    world = InProcessWorld(n, timeout=20)
    return run_ranks([lambda rank=rank: body(world.transport(rank)) for rank in range(n)])


def run_ranks(bodies):
    """Run each of ``bodies`` on its own thread (one per simulated rank); return their results in
    order, re-raise any error, and fail if one hangs."""
    results, errors = [None] * len(bodies), []

    def rank_main(rank):
        try:
            results[rank] = bodies[rank]()
        except BaseException as e:   # noqa: BLE001 - handed to the test thread
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"
    if errors:
        raise errors[0]
    return results


def rank_input(rank, count, dtype, op="sum"):
    """Integer-valued, rank-dependent data whose reductions are exact in every dtype tested."""
    i = np.arange(count)
    values = (i * 7 + rank * 13) % 11 + 1 if op != "prod" else (i + rank) % 3 + 1
    return values.astype(dtype)


def reference(inputs, op):
    if op == "avg":
        return (np.add.reduce(np.stack(inputs), axis=0) / len(inputs)).astype(inputs[0].dtype)
    return REFERENCE[op].reduce(np.stack(inputs), axis=0)


def allreduce_each(inputs, op, segment, in_place, reduce=algorithms.allreduce):
    """A simulated rank's body: all-reduce ``inputs[rank]`` (into itself if ``in_place``) by ``reduce``
    (an all-reduce of ``ring.algorithms``), return the result."""
    def body(t):
        x = inputs[t.rank]
        out = x if in_place else np.empty_like(x)
        reduce(t, BOUND, x, out, op, segment)
        return out
    return body


def check_allgather_then_broadcast(n, wrap, counts, dtype, root, segments):
    """Over ``wrap(body)`` (a transport wrapper), allgather every rank's input, then broadcast
    ``root``'s (segment sizes ``segments``), and check both results on every rank."""
    inputs = [rank_input(r, c, dtype) for r, c in enumerate(counts)]

    def body(t):
        gathered = np.empty(sum(counts), dtype)
        algorithms.allgather(t, BOUND, inputs[t.rank], gathered, counts, segments[0])
        buffer = inputs[root].copy() if t.rank == root else np.zeros(counts[root], dtype)
        algorithms.broadcast(t, BOUND, buffer, root, segments[1])
        return gathered, buffer

    for gathered, buffer in simulate(n, wrap(body)):
        np.testing.assert_array_equal(gathered, np.concatenate(inputs))
        np.testing.assert_array_equal(buffer, inputs[root])


def simulate_hosts(hosts: int, per_host: int, body):
    """Run ``body(local, across, world_rank)`` on hosts x per_host threads: each host an in-process world
    of its ranks, and one world across hosts per place on a host. Returns each rank's result."""
    local_worlds = [InProcessWorld(per_host, timeout=20) for _ in range(hosts)]
    across_worlds = [InProcessWorld(hosts, timeout=20) for _ in range(per_host)]
    return run_ranks([lambda h=h, p=p: body(local_worlds[h].transport(p), across_worlds[p].transport(h),
                                            h * per_host + p)
                      for h in range(hosts) for p in range(per_host)])
