"""Tier 3: the GPU path, on a machine with CuPy and a GPU; skipped (with the reason) elsewhere.

Collectives on cupy arrays against the MPI path on the same values, over NCCL at
one rank (and at two on one GPU where NCCL >= 2.30 is allowed to: NCCL_MULTI_RANK_GPU_ENABLE=1)
and over the host-staged transport at two and three; the all-reduce against NCCL's own; a shape
that differs across ranks; CUDA tensors through the torch backend; the bench and the trainer with
--device cuda. Each program's per-rank lines are printed (``pytest -rA`` shows them).
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


def nccl_fits(n: int) -> bool:
    """Whether NCCL can make a communicator of n ranks on this machine's GPUs."""
    return n <= GPUS or (nccl_version() >= 23000 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1")


def run_program(n: int, module: str, env: dict | None = None):
    result = run_world(n, ["-m", module], TIMEOUT_S, env=env)
    print(result.stdout[-3000:])
    return result


@pytest.mark.parametrize("n,transport", [(1, "nccl"), (2, "nccl"), (2, "staged"), (3, "staged")])
def test_every_collective_on_cupy_matches_the_host_path(n, transport):
    if transport == "nccl" and not nccl_fits(n):
        pytest.skip(f"NCCL {nccl_version()} cannot put {n} ranks on {GPUS} GPU(s)")
    result = run_program(n, "tests.programs.gpu_collectives", env={"COLLECTIVES_GPU_TRANSPORT": transport})
    assert result.returncode == 0, result.stdout[-4000:]
    expected_name = "NCCLTransport" if transport == "nccl" else "StagedTransport"
    assert result.stdout.count(f"over {expected_name}, 0 wrong") == n, result.stdout[-4000:]


def test_asking_for_nccl_where_ranks_share_a_gpu_fails_alike_on_every_rank():
    if GPUS > 1 or (nccl_version() >= 23000 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"):
        pytest.skip("here NCCL can carry two ranks")
    result = run_world(2, ["-m", "tests.programs.gpu_collectives"], TIMEOUT_S,
                       env={"COLLECTIVES_GPU_TRANSPORT": "nccl"})
    assert result.returncode != 0
    assert result.stdout.count("CollectiveError: NCCL cannot carry these ranks: ranks 0, 1 share GPU") == 2, \
        result.stdout[-4000:]


@pytest.mark.parametrize("n", [1, 2])
def test_the_ring_allreduce_on_cupy_matches_nccls_own(n):
    """Bit-identical to NCCL's allReduce where the order of additions is the same (1 and 2 ranks);
    where NCCL cannot make the communicator, against the host's reduction in rank order."""
    result = run_program(n, "tests.programs.gpu_against_nccl")
    assert result.returncode == 0, result.stdout[-4000:]
    reference = "NCCL's allReduce" if nccl_fits(n) else "the host"
    assert result.stdout.count(f"against {reference}") == n, result.stdout[-4000:]
    assert result.stdout.count(" 0 wrong") == n, result.stdout[-4000:]


def test_a_shape_that_differs_on_the_gpu_is_named_on_every_rank_and_the_ranks_go_on():
    result = run_program(2, "tests.programs.gpu_mismatch")
    assert result.returncode == 0, result.stdout[-4000:]
    assert result.stdout.count("the next all-reduce is right") == 2, result.stdout[-4000:]
    errors = [line for line in result.stdout.splitlines() if "Error: " in line]
    assert len(errors) == 2 and all("1001" in line and "1000" in line for line in errors), result.stdout[-4000:]


@pytest.mark.parametrize("n", [1, 2])
def test_cuda_tensors_through_the_torch_backend(n):
    pytest.importorskip("torch", reason="the torch backend's GPU test needs torch with CUDA")
    import torch
    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA")
    result = run_program(n, "tests.programs.torch_cuda")
    assert result.returncode == 0, result.stdout[-4000:]
    transport = "over nccl" if nccl_fits(n) else "over staged"
    assert result.stdout.count(f"torch CUDA checks {transport}") == n, result.stdout[-4000:]
    assert result.stdout.count(" 0 wrong") == n, result.stdout[-4000:]


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


def test_the_default_training_run_reaches_the_cpus_accuracy_on_the_gpu(tmp_path):
    """The README's run (digits, 20 epochs, float32) at 2 ranks: within 0.5 points of the CPU's."""
    accuracy = {}
    for device in ("cpu", "cuda"):
        result = run_world(2, ["-m", "trainer", "--device", device, "--checkpoint-dir", str(tmp_path / device)],
                           TIMEOUT_S)
        assert result.returncode == 0, result.stdout[-4000:]
        done = [line for line in result.stdout.splitlines() if line.startswith("done:")]
        print(device, done)
        accuracy[device] = float(done[-1].rpartition("test accuracy ")[2].rstrip("%"))
    assert abs(accuracy["cuda"] - accuracy["cpu"]) <= 0.5, accuracy


@pytest.mark.parametrize("scenario,launcher_args", [("absent", ()), ("killed", ()),
                                                    ("killed", ("-disable-auto-cleanup",))])
def test_a_rank_absent_or_killed_over_nccl_ends_the_others_call_with_an_error_not_a_hang(scenario, launcher_args):
    """Two ranks on one NCCL communicator: the one that waits gets CollectiveError (from the call, or
    from the watchdog's abort at the call's deadline), and the job ends well inside the launch's bound.
    Under MPICH's default a death makes the launcher end the others (then only the end is checked);
    under -disable-auto-cleanup the survivor must see the death itself."""
    if not nccl_fits(2):
        pytest.skip(f"NCCL {nccl_version()} cannot put 2 ranks on {GPUS} GPU(s)")
    result = run_world(2, ["-m", "tests.programs.gpu_faults", scenario], 120,
                       env={"COLLECTIVES_GPU_TRANSPORT": "nccl"}, launcher_args=launcher_args)
    print(result.stdout[-4000:])
    assert "TIMED OUT" not in result.stdout and "Timeout (0:01:00)!" not in result.stdout, result.stdout[-4000:]
    assert "never noticed" not in result.stdout, result.stdout[-4000:]
    assert result.stdout.count("over NCCLTransport") == 2, result.stdout[-4000:]
    if scenario == "absent":
        assert "rank 0: CollectiveError after" in result.stdout, result.stdout[-4000:]
        assert "rank 1: stayed away" in result.stdout, result.stdout[-4000:]
        return
    assert result.returncode != 0, result.stdout[-4000:]
    if launcher_args and "rank 0: CollectiveError after" not in result.stdout:
        assert "rank 0: device work queued by a collective was still unfinished" in result.stdout, result.stdout[-4000:]
        pytest.xfail("seen on an H100 with NCCL 2.32 (2026-11-27): the survivor's watchdog aborts the communicator "
                     "and the job ends, but the survivor ends without its own CollectiveError line (not yet known why)")
