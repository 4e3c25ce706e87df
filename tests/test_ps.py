"""Tier 2: parameter-server training (python -m trainer --strategy ps), judged against all-reduce training,
by the accuracy it reaches, and by how it ends when a server or a worker is killed."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.support.trainer import final_params, train
from tests.worlds import ROOT, keep_survivors, mpiexec, run_world
from trainer.strategies import ps


TWO_EPOCHS = ["--epochs", "2", "--hidden", "32", "16"]


def test_one_server_and_one_worker_are_exactly_one_rank_of_sgd(tmp_path):
    reference = final_params(train(1, tmp_path, "allreduce", *TWO_EPOCHS)[0])
    directory, log = train(2, tmp_path, "ps", *TWO_EPOCHS, "--strategy", "ps", "--max-staleness", "0")
    assert "as 1 server(s), 1 worker(s) (ps)" in log, log
    for ours, theirs in zip(final_params(directory), reference):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("n, servers", [(3, 1), (4, 1), (4, 2)])
def test_synchronous_parameter_servers_train_the_all_reduce_model(tmp_path, n, servers):
    reference, _ = final_params(train(2, tmp_path, "allreduce", *TWO_EPOCHS)[0])
    directory, log = train(n, tmp_path, "ps", *TWO_EPOCHS, "--strategy", "ps", "--servers", str(servers),
                           "--max-staleness", "0", "--metrics", str(tmp_path / "m.jsonl"))
    params, _ = final_params(directory)
    np.testing.assert_allclose(params, reference, rtol=1e-5, atol=1e-9)
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and all(r["staleness_max"] == 0 for r in records)
    assert all(len(r["server_bytes_per_sec"]) == servers and min(r["server_bytes_per_sec"]) > 0 for r in records)
    assert records[-1]["updates"] == records[-1]["step"], "one update per step when synchronous"


def test_a_synchronous_run_resumes_bit_identical(tmp_path):
    straight, _ = train(3, tmp_path, "straight", *TWO_EPOCHS, "--strategy", "ps", "--max-staleness", "0")
    resumed, _ = train(3, tmp_path, "resumed", *TWO_EPOCHS, "--epochs", "1", "--strategy", "ps",
                       "--max-staleness", "0")
    _, log = train(3, tmp_path, "resumed", *TWO_EPOCHS, "--resume", "--strategy", "ps", "--max-staleness", "0")
    assert "resuming from" in log, log
    for a, b in zip(final_params(straight), final_params(resumed)):
        np.testing.assert_array_equal(a, b)


def test_asynchronous_workers_reach_the_accuracy_bar_on_digits_within_a_minute(tmp_path):
    started = time.monotonic()
    result = run_world(3, ["-m", "trainer", "--strategy", "ps", "--metrics", str(tmp_path / "m.jsonl")], 120)
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert records[-1]["test_accuracy"] >= 0.95 and wall < 60, (wall, records[-1])
    assert sum(r["staleness_max"] for r in records) > 0, "two free workers should see some staleness"


@pytest.mark.parametrize("flags, n, message", [
    (["--strategy", "ps"], 1, "--strategy ps: needs at least 2 ranks"),
    (["--strategy", "ps", "--servers", "2"], 2, "--servers 2: expected 1 to 1 with 2 ranks"),
    (["--strategy", "ps", "--servers", "0"], 2, "--servers: must be >= 1, got 0"),
    (["--servers", "1"], 2, "--servers: only for --strategy ps"),
    (["--strategy", "ps", "--tensor-parallel", "2"], 2, "--tensor-parallel: not with --strategy ps"),
])
def test_bad_parameter_server_flags_are_usage_errors(flags, n, message):
    result = run_world(n, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and message in result.stdout, result.stdout[-3000:]


LONG = ["--dataset", "synthetic", "--samples", "20000", "--epochs", "200", "--strategy", "ps"]


@pytest.mark.parametrize("victim, role", [(2, "server"), (1, "worker")])
def test_a_killed_server_or_worker_ends_the_job_naming_it(victim, role):
    # MPICH's launcher kills the whole job as soon as one process dies, and its report names some pid,
    # not always the dead one's: asked not to (-disable-auto-cleanup), it lets the runtime see the death
    # and name the rank (Open MPI's: a "recoverable" job; tests.worlds.keep_survivors).
    command = [*mpiexec(), *keep_survivors(), "-n", "3", sys.executable, "-m", "trainer", *LONG]
    job = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                           start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    guard = threading.Timer(120, lambda: os.killpg(job.pid, signal.SIGKILL))
    guard.start()
    try:
        seen, pids = [], {}
        for line in job.stdout:
            seen.append(line)
            if line.startswith("ranks (pid): "):
                pids = {int(r): int(p) for r, p in re.findall(r"(\d+) \((\d+)\)", line)}
            if line.startswith("epoch") and pids:
                break   # training is under way
        killed = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        rest = job.stdout.read()
        job.wait()
        ended = time.monotonic() - killed
    finally:
        guard.cancel()
    output = "".join(seen) + rest
    assert job.returncode != 0 and ended < 30, (ended, output[-3000:])
    # A survivor that reports names the dead rank. MPICH can still take the job down before any survivor
    # reports (its launcher reports the kill, or fails itself).
    reports = re.findall(r"\[rank \d\] error: .*", output)
    assert all(f"rank {victim}" in report for report in reports), output[-3000:]


def test_a_server_that_times_out_names_the_worker_not_waiting_on_it():
    # Worker 0 waits on the server for its next pull; worker 1 went quiet earlier, but its last message
    # was read later (messages are heard when read): the stalled one is still worker 1.
    server = ps.Server.__new__(ps.Server)
    server.pending = [(0, ps.PULL, 20)]
    assert server._silent({0: 10.0, 1: 10.5, 2: 9.0}, done={2}) == 1
    server.pending = []   # nobody waits (unbounded staleness): the one heard from longest ago
    assert server._silent({0: 10.0, 1: 10.5}, done=set()) == 0
    server.pending = [(0, ps.PULL, 20), (1, ps.PULL, 20)]   # all wait: still name one
    assert server._silent({0: 10.0, 1: 10.5}, done=set()) == 0


@pytest.mark.parametrize("role, how", [("server", "raises"), ("worker", "raises"), ("server", "stalls"),
                                       ("worker", "stalls")])
def test_a_server_or_worker_that_raises_or_stalls_ends_the_job_naming_it(role, how):
    victim = 2 if role == "server" else 1
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.ps_fault", role, how, "--strategy", "ps", "--max-staleness", "0",
                           "--epochs", "5"], 90, env={"COLLECTIVES_TIMEOUT": "3"})
    wall = time.monotonic() - started
    assert result.returncode not in (0, -9) and wall < 30, (wall, result.stdout[-3000:])
    survivors = [r for r in range(3) if r != victim]
    # (two ranks' lines may be spliced together by the launcher: a message ends where the next begins)
    errors = dict(re.findall(r"\[rank (\d)\] error: (.*?)(?=\[rank \d\] error: |\n|$)", result.stdout))
    assert sorted(map(int, errors)) == survivors, result.stdout[-3000:]
    for rank, message in errors.items():
        # every survivor names the victim, or (a worker waiting on the server, which waits on a stalled
        # worker) names the server, which names the victim
        assert f"rank {victim}" in message or (how == "stalls" and "rank 2" in message), message
    if role == "worker" and how == "stalls":
        assert "the server heard nothing from worker rank 1" in errors["2"], errors
