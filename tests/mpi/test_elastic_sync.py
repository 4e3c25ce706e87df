"""Tier 2: ``col.elastic.State.sync`` gives every rank rank 0's items, bit for bit, whatever their
dtype (bfloat16 too, as numpy and as torch holds it) and whatever shape a rank held before.
Run under mpiexec -n 1..4 by tests/test_worlds.py."""
import numpy as np
import pytest

import collectives as col
from tests.support.in_world import COMM, N, RANK, agree


pytestmark = pytest.mark.mpi


def test_sync_gives_every_rank_rank_0s_arrays_bit_for_bit_bfloat16_too():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    values = np.arange(6, dtype=np.float32) * 0.5 + 100 * RANK
    state = col.elastic.State(
        weights=values.astype(ml_dtypes.bfloat16),
        tensor=torch.from_numpy(values).to(torch.bfloat16),
        grown=np.zeros(3 + RANK),   # a different shape on every rank: replaced by rank 0's
        step=RANK)
    state.sync()
    expected = np.arange(6, dtype=np.float32) * 0.5
    agree(state.weights.dtype == ml_dtypes.bfloat16 and np.array_equal(state.weights.astype(np.float32), expected),
          f"numpy bfloat16 after sync: {state.weights!r}")
    agree(state.tensor.dtype == torch.bfloat16 and state.tensor.float().numpy().tolist() == expected.tolist(),
          f"torch bfloat16 after sync: {state.tensor!r}")
    agree(state.grown.shape == (3,) and state.step == 0 and state.commits == COMM.bcast(state.commits),
          f"shapes and values after sync: {state.grown.shape}, step {state.step}")
    state.weights[...] = 7
    state.restore()   # (sync commits what it received)
    agree(np.array_equal(state.weights.astype(np.float32), expected), "restore after sync")
    assert N >= 1


def test_an_item_that_is_an_array_on_rank_0_and_a_value_elsewhere_becomes_rank_0s():
    state = col.elastic.State(item=np.arange(3.0) if RANK == 0 else [1, 2, 3], other=[RANK] if RANK else np.ones(2))
    state.sync()
    agree(isinstance(state.item, np.ndarray) and state.item.tolist() == [0.0, 1.0, 2.0], f"item: {state.item!r}")
    agree(isinstance(state.other, np.ndarray) and state.other.tolist() == [1.0, 1.0], f"other: {state.other!r}")
