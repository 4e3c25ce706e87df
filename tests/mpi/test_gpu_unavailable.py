"""Tier 2: asking for the GPU path where it cannot run (no CuPy, or no usable GPU) raises the same
CollectiveError on every rank, naming the rank and what is missing, and leaves the world in step."""
import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD


def _has_a_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # no CuPy, or no driver: exactly the case under test
        return False


@pytest.mark.skipif(_has_a_gpu(), reason="a GPU is usable here (tests/test_gpu.py covers it)")
def test_use_local_gpu_without_a_usable_gpu_fails_alike_everywhere_and_the_world_goes_on():
    with pytest.raises(col.CollectiveError, match="the GPU path is not available on rank 0: ") as caught:
        col.use_local_gpu()
    message = str(caught.value)
    assert ("CuPy" in message) or ("CUDA" in message), message
    assert set(COMM.allgather(message)) == {message}
    x = np.arange(7, dtype=np.float64) * (COMM.Get_rank() + 1)
    expected = np.empty_like(x)
    COMM.Allreduce(x, expected)
    np.testing.assert_array_equal(col.allreduce(x), expected)
