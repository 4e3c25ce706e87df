"""Tier 3: the GPU path, on a machine with CuPy and a GPU; skipped (with the reason) elsewhere.

Collectives on cupy arrays against the MPI path on the same values, over NCCL at
one rank (NCCL refuses several ranks on one GPU before 2.30) and over the
host-staged transport at two; the bench and the trainer with --device cuda.
"""
import json
import os

import numpy as np
import pytest

from tests.worlds import run_world

cupy = pytest.importorskip("cupy", reason="no CuPy here: the GPU path is checked on a GPU machine")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:
    GPUS = 0
if GPUS == 0:
    pytest.skip("CuPy is installed but no GPU is visible", allow_module_level=True)

TIMEOUT_S = 300


def nccl_version() -> int:
    from cupy.cuda import nccl
    return nccl.get_version()


@pytest.mark.parametrize("n,transport", [(1, "nccl"), (2, "staged"), (3, "staged")])
def test_every_collective_on_cupy_matches_the_host_path(n, transport):
    if transport == "nccl" and n > GPUS and not (nccl_version() >= 23000 and
                                                  os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"):
        pytest.skip(f"NCCL {nccl_version()} cannot put {n} ranks on {GPUS} GPU(s)")
    result = run_world(n, ["-m", "tests.programs.gpu_collectives"], TIMEOUT_S,
                       env={"COLLECTIVES_GPU_TRANSPORT": transport})
    assert result.returncode == 0, result.stdout[-4000:]
    expected_name = "NCCLTransport" if transport == "nccl" else "StagedTransport"
    assert result.stdout.count(f"over {expected_name}, 0 wrong") == n, result.stdout[-4000:]


def test_asking_for_nccl_where_ranks_share_a_gpu_fails_alike_on_every_rank():
    if GPUS > 1 or (nccl_version() >= 23000 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"):
        pytest.skip("here NCCL can carry two ranks")
    result = run_world(2, ["-m", "tests.programs.gpu_collectives"], TIMEOUT_S,
                       env={"COLLECTIVES_GPU_TRANSPORT": "nccl"})
    assert result.returncode != 0
    assert result.stdout.count("NCCL cannot carry these ranks: ranks 0, 1 share GPU") == 2, result.stdout[-4000:]


def test_bench_on_the_gpu_is_exact_against_nccl(tmp_path):
    out = tmp_path / "gpu.json"
    result = run_world(1, ["-m", "bench", "--device", "cuda", "--max-bytes", "64M", "--factor", "8",
                           "--json", str(out)], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["impl"] for r in rows} == {"ring", "nccl"} and all(r["wrong"] == 0 for r in rows)


def test_trainer_on_the_gpu_trains_the_model_the_cpu_trains(tmp_path):
    finals = {}
    for device in ("cpu", "cuda"):
        result = run_world(1, ["-m", "trainer", "--device", device, "--epochs", "2", "--dtype", "float64",
                               "--checkpoint-dir", str(tmp_path / device)], TIMEOUT_S)
        assert result.returncode == 0, result.stdout[-4000:]
        saved = sorted((tmp_path / device).glob("*.npz"))[-1]
        finals[device] = np.load(saved)["params"]
    np.testing.assert_allclose(finals["cuda"], finals["cpu"], rtol=1e-6, atol=1e-9)
