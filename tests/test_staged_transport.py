"""Tier 1: the host-staged transport (the GPU fallback) under the real ring, n = 1..8 ranks as threads.

Here it carries numpy arrays (every send is copied out, every receive lands in a
host buffer first and is copied into place when waited for): the same staging
logic as for cupy arrays, whose host-device copies only the GPU machine runs.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ring.transport.base import unbounded
from ring.transport.gpu.staged import StagedTransport
from tests.support.simulated import allreduce_each, check_allgather_then_broadcast, rank_input, reference, simulate


def staged(body):
    return lambda transport: body(StagedTransport(transport))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 300), segment=st.integers(1, 50),
       op=st.sampled_from(["sum", "avg", "min", "max", "prod"]), in_place=st.booleans())
def test_allreduce_over_staging_matches_numpy(n, count, segment, op, in_place):
    inputs = [rank_input(r, count, np.float64, op) for r in range(n)]
    expected = reference(inputs, op)
    for result in simulate(n, staged(allreduce_each(inputs, op, segment, in_place))):
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_allgather_and_broadcast_over_staging(n):
    check_allgather_then_broadcast(n, staged, [(r * 5) % 7 for r in range(n)], np.int32, root=n // 2,
                                   segments=(3, 2))


def test_staging_sends_copies_so_later_writes_to_the_source_cannot_leak():
    sent = np.arange(6.0)

    class Recorder:
        rank, size, local_rank, local_size = 0, 2, 0, 2

        def send_to_right(self, buf, bound):
            self.buffer = buf
            return "send"

        def wait(self, request, bound):
            pass

    host, bound = Recorder(), unbounded()
    request = StagedTransport(host).send_to_right(sent, bound)
    sent[:] = -1                      # the caller reuses its buffer before the send completes
    StagedTransport(host).wait(request, bound)
    np.testing.assert_array_equal(host.buffer, np.arange(6.0))
