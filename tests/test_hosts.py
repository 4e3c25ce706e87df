"""Tier 2, issue 25: several hosts emulated on this machine (scripts/emulate_hosts.sh: a network
namespace per host, with its own hostname and IPC namespace, a bridge between them), the conformance
suite (tests/mpi) run across them at 2 x 2 (MPICH over UCX, and over libfabric's tcp), 3 x 2 and
an uneven 3 + 1; faults across hosts (a rank killed, a host that vanishes, MPICH's own cleanup, the
trainer losing a host). Needs root and MPICH; skipped with the reason elsewhere. Every run is bounded in time,
and the hosts are removed whatever happens (stale ones of a killed run first)."""
import glob
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from ring.transport.host_waits import process_state as _process_state
from tests.support.faults import OWN_OUTPUT, read_own_output
from tests.support.hosts import (BOUND_S, DEATH, HOSTFILES, HOSTS, SCRIPT, emulated_hosts, finish, hostfiles_removed,
                                 kill_everything, kill_host, rebuild, tx_bytes)
from tests.world_outcomes import TEST_TIMEOUT_S, WORLD_TIMEOUT_S
from tests.worlds import ROOT, WORLD_PYTEST


OFI_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
NETMODS = {"ucx": {}, "ofi-tcp": OFI_TCP}


@pytest.fixture(scope="module")
def cluster():
    yield from emulated_hosts("MPICH")


def _launch(layout: str, args: list[str], env: dict | None = None, python: bool = True) -> subprocess.Popen:
    """Start ``emulate_hosts.sh run LAYOUT -- python ARGS`` (``python=False``: ``-- ARGS``, mpiexec's
    own options first) from the repository root, its output collected."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
                   **(env or {})}
    command = [str(SCRIPT), "run", layout, "--", *([sys.executable] if python else []), *args]
    return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _run(layout: str, args: list[str], env: dict | None = None, python: bool = True,
         bound: float = BOUND_S) -> subprocess.CompletedProcess:
    return finish(_launch(layout, args, env, python), bound)


def test_a_run_killed_at_its_bound_leaves_no_hostfile_behind(cluster):
    before = set(glob.glob(HOSTFILES))
    with hostfiles_removed():
        process = _launch("1,1", ["-c", "import time; time.sleep(60)"])
        deadline = time.monotonic() + 30
        while not set(glob.glob(HOSTFILES)) - before and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        made = set(glob.glob(HOSTFILES)) - before
        assert made, "the run made no hostfile"
        assert finish(process, bound=1).returncode == -9
        assert set(glob.glob(HOSTFILES)) - before == made   # (SIGKILLed: its own trap never ran)
    assert set(glob.glob(HOSTFILES)) == before


@pytest.mark.parametrize("layout, netmod", [("2,2", "ucx"), ("2,2", "ofi-tcp"), ("2,2,2", "ucx"), ("3,1", "ucx")])
def test_ranks_know_their_hosts_and_the_bytes_cross_the_links(cluster, layout, netmod):
    before = tx_bytes("ringh2")
    result = _run(layout, ["-m", "tests.programs.edges", "hosts"], OFI_TCP if netmod == "ofi-tcp" else None)
    assert result.returncode == 0, result.stdout[-3000:]
    slots = [int(s) for s in layout.split(",")]
    found = {int(r): (host, int(local), int(size)) for r, host, local, size in
             re.findall(r"rank (\d+): host (\S+) local (\d+)/(\d+) sum right", result.stdout)}
    expected, rank = {}, 0
    for h, count in enumerate(slots, 1):
        for local in range(count):
            expected[rank] = (f"ringh{h}", local, count)
            rank += 1
    assert found == expected, result.stdout[-3000:]
    assert tx_bytes("ringh2") - before > 1 << 20, "host 2 sent less than a chunk: shared memory, not the link?"


#: What 2 x 2 over libfabric runs of tests/mpi (ACROSS_HOSTS): every collective against mpi4py's own, every algorithm
#: forced, groups, async handles and point-to-point, at the default segments. The rest (argument
#: checks, mismatches, the API's edges, tiny segments) does not depend on where the ranks are: it runs
#: at the first layout here and on one host in every world of tests/test_worlds.py.
#: What depends on the hosts, for the layouts after the first: every collective and algorithm, but of
#: the integer dtypes only int32 and int64 (the narrower ones change nothing that crosses a link).
#: And at the layouts of more than two hosts or uneven hosts, only what the layout changes: where each
#: collective's and each algorithm's bytes go (the hierarchical one's levels at 2 x 2 x 2, its refusal
#: at 3 + 1); groups, async handles and point-to-point move bytes between two ranks as at 2 x 2.
_ONE_HOST_ONLY = "not 96-byte-segments and not int8 and not int16 and not uint"
ACROSS_HOSTS = ["tests/mpi/test_collectives.py", "tests/mpi/test_personalized.py", "tests/mpi/test_algorithms.py",
                "tests/mpi/test_groups.py", "tests/mpi/test_async.py", "tests/mpi/test_p2p.py", "-k", _ONE_HOST_ONLY]
BY_LAYOUT = ["tests/mpi/test_collectives.py", "tests/mpi/test_algorithms.py", "-k", _ONE_HOST_ONLY]


@pytest.mark.parametrize("layout, netmod, tests", [("2,2", "ucx", ["tests/mpi"]), ("2,2", "ofi-tcp", ACROSS_HOSTS),
                                                   ("2,2,2", "ucx", BY_LAYOUT), ("3,1", "ucx", BY_LAYOUT)],
                         ids=["2,2-ucx-all", "2,2-ofi-tcp", "2,2,2-ucx", "3,1-ucx"])
def test_every_collective_matches_mpi4py_across_hosts(cluster, layout, netmod, tests):
    """tests/mpi (every collective, op and dtype against mpi4py's own, async handles, groups,
    point-to-point, each algorithm forced) with its ranks on several hosts: all of it at 2 x 2 over
    UCX, what depends on the hosts (ACROSS_HOSTS) over libfabric's tcp, what depends on the layout
    (BY_LAYOUT) at 2 x 2 x 2 and 3 + 1."""
    # The torch backend's tests compare with gloo, whose rendezvous they put on 127.0.0.1: one host's own.
    known = ["--ignore", "tests/mpi/test_torch.py"]
    # (and the only other test that imports torch, for a bfloat16 tensor, costs its 4 ranks 2 s each: what it
    # moves between hosts is numpy bytes, as the other sync test here moves)
    known += ["--deselect", "tests/mpi/test_elastic_sync.py::test_sync_gives_every_rank_rank_0s_arrays_bit_for_bit_"
              "bfloat16_too"]
    # (bounded as the same tests' worlds on one host are: on a loaded machine all of tests/mpi across hosts takes
    # longer than a launch's usual bound, moving on all the while)
    result = _run(layout, [*WORLD_PYTEST, *tests, "-x", "--timeout", str(TEST_TIMEOUT_S), *known],
                  OFI_TCP if netmod == "ofi-tcp" else None, bound=WORLD_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("netmod", NETMODS)
def test_a_rank_killed_on_another_host_is_named_by_every_survivor_on_both_hosts(cluster, netmod, tmp_path):
    """2 x 2 under -disable-auto-cleanup: rank 3 (host 2) is SIGKILLed while the others wait for it
    in a call. Its host mate sees its process end; the ranks on host 1 see its liveness connection
    close (ring.transport.mpi.liveness) or hear it from rank 2, whichever comes first. MPICH's proxy on
    host 2 sometimes kills rank 2 at once as well (it then prints nothing, not even a fault:
    PYTHONFAULTHANDLER is on); the ranks on host 1 must speak in every run."""
    env = {**NETMODS[netmod], "OWN_OUTPUT": str(tmp_path / "out")}
    process = _launch("2,2", ["-disable-auto-cleanup", str(OWN_OUTPUT), sys.executable, "-m", "tests.programs.edges",
                              "killed", "waiting", "3"], env, python=False)
    result = finish(process, 60)
    job_ended = time.monotonic()
    outputs = {r: read_own_output(tmp_path, r) for r in range(4)}
    assert result.returncode != -9, (result.stdout, outputs)
    for rank, output in outputs.items():
        assert "Fatal Python error" not in output and "Traceback" not in output, outputs
        if rank == 3 or (rank == 2 and output.count("\n") == 1):   # (the victim; rank 2 killed by the launcher)
            continue
        found = re.search(rf"rank {rank}: CollectiveError after ([\d.]+) s in call 2: allreduce #7 on rank {rank}: "
                          + DEATH, output)
        assert found and float(found.group(1)) < 5, outputs
        assert "exiting with status 1 without MPI_Finalize" in output, outputs
        ended = float(re.search(rf"rank {rank}: program ended at ([\d.]+)", output).group(1))
        assert job_ended - ended < 10, (job_ended - ended, outputs)


@pytest.mark.parametrize("attempt", range(3))
def test_a_rank_killed_while_async_all_reduces_send_to_it_crashes_no_survivor(cluster, attempt, tmp_path):
    """Issue 36, item 1: 2 x 2 over UCX, rank 3 is SIGKILLed 0.2 s into 20 async 16 MB all-reduces,
    whose two-level reduce-scatter sends to it across hosts. MPICH over UCX dies of SIGSEGV when
    asked to send to a peer whose connection it has seen close, so every send to another host looks
    at the peer's liveness connection first. Every survivor on host 1 names rank 3; none crashes.
    Three runs here: the race is hit by chance."""
    env = {"OWN_OUTPUT": str(tmp_path / "out")}
    process = _launch("2,2", ["-disable-auto-cleanup", str(OWN_OUTPUT), sys.executable, "-m", "tests.programs.edges",
                              "killed-async", "3"], env, python=False)
    result = finish(process, 90)
    outputs = {r: read_own_output(tmp_path, r) for r in range(4)}
    assert result.returncode != -9, (result.stdout, outputs)
    crashed = [rank for rank in (0, 1, 2) if "Segmentation fault" in outputs[rank] or "Fatal Python error" in outputs[rank]]
    if crashed and all(re.search(r"in (send_to_right|sending_to|exchange)\b", outputs[rank]) for rank in crashed):
        # the send looked at the peer's liveness first, yet UCX had seen its connection close before
        # that look did (about 1 launch in 20 beside load): a product bug, open as issue 58's item 7
        pytest.xfail(f"issue 58 item 7 (open): rank(s) {crashed} crashed in a send to the dead rank 3 over UCX")
    assert not crashed, outputs
    for rank in (0, 1):   # (rank 2 is sometimes killed by MPICH's proxy on host 2 at once: see above)
        assert re.search(rf"rank {rank}: CollectiveError after [\d.]+ s in work \d+: allreduce #\d+ on rank {rank}: "
                         r"ranks? [\d, ]*3 (is|are) gone", outputs[rank]), (result.stdout, outputs)


def test_with_the_launchers_cleanup_the_survivors_are_killed_and_mpiexec_names_the_dead_process(cluster, tmp_path):
    """What the README says of MPICH's default: the job ends at once, mpiexec's banner names the
    dead process and its host, and every other rank is killed before it can say anything."""
    env = {"OWN_OUTPUT": str(tmp_path / "out")}
    started = time.monotonic()
    result = finish(_launch("2,2", [str(OWN_OUTPUT), sys.executable, "-m", "tests.programs.edges", "killed",
                                     "waiting", "3"], env, python=False), 60)
    outputs = {r: read_own_output(tmp_path, r) for r in range(4)}
    victim = re.search(r"rank 3: pid (\d+)", outputs[3]).group(1)
    assert result.returncode not in (0, -9) and time.monotonic() - started < 20, result.stdout
    # (the banner names the first process on host 2 that hydra's proxy saw end: the victim, or, 1 run in
    # about 10 from a fresh clone, pid victim - 1, the victim's host mate killed in the cleanup)
    named = re.search(r"PID (\d+) RUNNING AT ringh2", result.stdout)
    assert named and int(named.group(1)) in (int(victim), int(victim) - 1) and "EXIT CODE: 9" in result.stdout, \
        result.stdout
    assert all("CollectiveError" not in output for output in outputs.values()), outputs


def _wait_for_lines(tmp_path, text: str, count: int, process: subprocess.Popen, bound: float) -> None:
    give_up = time.monotonic() + bound
    while sum(read_own_output(tmp_path, r).count(text) for r in range(4)) < count:
        assert process.poll() is None and time.monotonic() < give_up, (process.poll(), [read_own_output(tmp_path, r) for r in range(4)])
        time.sleep(0.02)


def _vanish(host: int) -> None:
    """Host ``host`` leaves the network (its link down first: no reset reaches anyone), then its
    processes are killed."""
    subprocess.run(["ip", "-n", "ringhsw", "link", "set", f"v{host}", "down"], check=True, timeout=30)
    kill_host(f"ringh{host}")


def _alive(pid: int) -> bool:
    return _process_state(pid) is None   # (a zombie counts as ended)


@pytest.mark.parametrize("netmod", NETMODS)
@pytest.mark.parametrize("timeout, seen", [(4, "by the roll call after the timeout"), (30, "by keepalive")])
def test_a_host_that_vanishes_is_named_unreachable_and_the_survivors_exit(cluster, netmod, timeout, seen, tmp_path):
    """2 x 2: every rank says it is ready; host 2 leaves the network and its processes are killed;
    the ranks of host 1 then call an all-reduce with ``timeout=``. Each raises within the timeout
    plus 2 s (with a long timeout: within liveness.UNREACHABLE_SECONDS plus 2 s) naming ranks 2
    and 3 unreachable, and its process ends within 3 s more. mpiexec itself never notices (it
    waits for its proxy on host 2 for ever): the test ends it."""
    from ring.transport.mpi.liveness import UNREACHABLE_SECONDS
    env = {**NETMODS[netmod], "OWN_OUTPUT": str(tmp_path / "out")}
    process = _launch("2,2", ["-disable-auto-cleanup", str(OWN_OUTPUT), sys.executable, "-m", "tests.programs.edges",
                              "vanished", str(timeout), str(tmp_path / "host-2-gone")], env, python=False)
    try:
        _wait_for_lines(tmp_path, " ready", 4, process, 60)
        _vanish(2)
        (tmp_path / "host-2-gone").touch()   # (the cue: the ranks of host 1 call now)
        pids = {r: int(re.search(r"pid (\d+) ready", read_own_output(tmp_path, r)).group(1)) for r in (0, 1)}
        give_up = time.monotonic() + min(timeout, UNREACHABLE_SECONDS) + 1 + 2 + 3 + 5
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < give_up:
            time.sleep(0.05)
        exited = {r: not _alive(pid) for r, pid in pids.items()}
    finally:
        kill_everything(process)
        process.communicate()
        rebuild()
    outputs = {r: read_own_output(tmp_path, r) for r in (0, 1)}
    for rank, output in outputs.items():
        found = re.search(rf"rank {rank}: CollectiveError after ([\d.]+) s in the call after: allreduce #5 on rank "
                          rf"{rank}: (.*)", output)
        assert found, outputs
        waited, message = float(found.group(1)), found.group(2)
        assert waited < min(timeout, UNREACHABLE_SECONDS) + 2, outputs
        if timeout < UNREACHABLE_SECONDS:
            assert "rank(s) unreachable (their host did not acknowledge a message for 1 s: its link or the host " \
                   "is down): 2, 3" in message, outputs
        else:
            # (or heard from the other; or one link's keepalive ran out a moment before the other's)
            assert re.fullmatch(r"(ranks 2, 3 are|rank [23] is) unreachable: host ringh2 does not answer \(its link "
                                r"or the host is down\)( \(seen by rank [01]\))?", message), outputs
        assert exited[rank] and "exiting with status 1 without MPI_Finalize" in output, outputs
        assert "Fatal Python error" not in output and "Traceback" not in output, outputs


@pytest.mark.parametrize("source", ["from-1", "any"])
@pytest.mark.parametrize("netmod", NETMODS)
def test_a_message_still_crossing_a_slow_link_when_its_sender_ends_is_received(cluster, netmod, source):
    """Rank 1 on host 2 leaves 4 MiB on their way to rank 0 on host 1 (links of 10 Mbit/s: 3.3 s) as
    its program ends: its farewell says so, and rank 0's receive goes on until the message is in (over
    UCX the farewell overtook the message, and the receive failed naming rank 1 0.9 s in)."""
    for host in ("1", "2"):
        subprocess.run([str(SCRIPT), "shape", host, "10mbit"], check=True, timeout=60)
    try:
        result = _run("1,1", ["-m", "tests.programs.edges", "p2p-in-flight", str(1 << 19), source], env=NETMODS[netmod])
    finally:
        for host in ("1", "2"):
            subprocess.run([str(SCRIPT), "shape", host, "none"], check=True, timeout=60)
    assert result.returncode == 0 and "rank 0: received right" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("netmod", NETMODS)
def test_parameter_servers_train_across_hosts(cluster, netmod):
    """2 x 2, one server (rank 3, on host 2) and three workers on both hosts: the server's receives
    from any rank take every worker's messages (over UCX they waited until the timeout, hearing
    nothing more from host 1 once one message from there had come: ``ring.transport.mpi.p2p``)."""
    result = _run("2,2", ["-m", "trainer", "--strategy", "ps", "--epochs", "1"],
                  {**NETMODS[netmod], "COLLECTIVES_TIMEOUT": "20"})
    assert result.returncode == 0 and "done: 1 epoch(s)" in result.stdout, result.stdout[-3000:]


def _trainer_ranks_on(host: str) -> list[int]:
    pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
            if argv[1:3] == [b"-m", b"trainer"] and _alive(int(pid)):   # (not mpiexec, whose arguments hold the same)
                found.append(int(pid))
        except FileNotFoundError:
            pass
    return found


def test_the_trainer_loses_a_host_and_resumes_bit_identically(cluster, tmp_path):
    """2 x 2: a run with --checkpoint-dir loses host 2 (link down, processes killed) after its
    third checkpoint; the ranks of host 1 end with an error naming the unreachable ranks; the same
    job, started again with --resume on the rebuilt hosts, ends with exactly the parameters of a
    run that was never interrupted."""
    from trainer import checkpoint
    train = ["-m", "trainer", "--epochs", "8", "--dtype", "float64", "--batch-size", "50"]
    straight = _run("2,2", [*train, "--checkpoint-dir", str(tmp_path / "straight")])
    assert straight.returncode == 0, straight.stdout[-3000:]
    directory = tmp_path / "interrupted"
    process = _launch("2,2", ["-disable-auto-cleanup", sys.executable, *train, "--checkpoint-dir", str(directory)],
                      python=False)
    try:
        give_up = time.monotonic() + 120
        while not (directory / "checkpoint-epoch000003.npz").exists():
            assert process.poll() is None and time.monotonic() < give_up, process.communicate()[0][-3000:]
            time.sleep(0.01)
        _vanish(2)
        give_up = time.monotonic() + 30
        while _trainer_ranks_on("ringh1") and time.monotonic() < give_up:
            time.sleep(0.05)
        left = _trainer_ranks_on("ringh1")
    finally:
        kill_everything(process)
        output = process.communicate()[0]
        rebuild()
    assert not left, output[-3000:]
    assert re.search(r"\[rank 0\] error: .*rank(s)? .*unreachable", output), output[-3000:]
    saved = int(checkpoint.newest_valid(directory)[1]["step"])
    resumed = _run("2,2", [*train, "--checkpoint-dir", str(directory), "--resume"])
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stdout[-3000:]
    final = checkpoint.newest_valid(directory)[1]
    reference = checkpoint.newest_valid(tmp_path / "straight")[1]
    assert int(final["step"]) == int(reference["step"]) > saved
    for name in ("params", "velocity"):
        np.testing.assert_array_equal(final[name], reference[name])


def _elastic_final(output: str) -> str:
    found = re.search(r"final ([0-9a-f]{16}) at step \d+ on \d+ ranks", output)
    assert found, output[-3000:]
    return found.group(1)


def test_an_elastic_job_loses_a_rank_on_another_host_and_ends_with_the_bits_of_a_restart(cluster, tmp_path):
    """Issue 38: 2 x 2, rank 3 (host 2) SIGKILLs itself before step 30; the three survivors, on
    two hosts, go on from their last commit, and end with the bits of 2 x 2 to that step, then 2 + 1.
    The commit is of step 30, or of step 29 where a survivor had not yet received all of step 29's
    all-reduce from rank 3 (possible on a loaded machine): rank 3 had its result, not every peer."""
    job = ["-m", "tests.programs.elastic_job", "--steps", "80"]
    result = _run("2,2", ["-disable-auto-cleanup", sys.executable, *job, "--kill", "3@30"], python=False)
    back = re.search(r"elastic: rank 3 gone: 4 -> 3 ranks; back to step (30|29)\b", result.stdout)
    assert back, result.stdout[-3000:]
    saved = tmp_path / "at.npz"
    assert _run("2,2", [*job, "--save-at", back.group(1), str(saved)]).returncode == 0
    resumed = _run("2,1", [*job, "--load", str(saved)])
    assert _elastic_final(result.stdout) == _elastic_final(resumed.stdout), (result.stdout[-2000:], resumed.stdout)


def test_an_elastic_job_loses_a_whole_host_and_goes_on(cluster, tmp_path):
    """Issue 38: 2 x 2, host 2 leaves the network mid-run (link down, its processes killed). The
    ranks of host 1 find it unreachable (keepalive, liveness.UNREACHABLE_SECONDS) and go on as a
    world of 2 within 15 s. mpiexec never notices the host is gone (it waits for its proxy there):
    the test ends it once the job has printed its result."""
    env = {"OWN_OUTPUT": str(tmp_path / "out")}
    process = _launch("2,2", ["-disable-auto-cleanup", str(OWN_OUTPUT), sys.executable, "-m",
                              "tests.programs.elastic_job", "--steps", "160", "--step-seconds", "0.05"], env,
                      python=False)
    try:
        _wait_for_lines(tmp_path, "step 20 on 4 ranks", 1, process, 60)
        vanished = time.time()
        _vanish(2)
        give_up = time.monotonic() + 60
        while "final " not in read_own_output(tmp_path, 0) and time.monotonic() < give_up:
            time.sleep(0.1)
    finally:
        kill_everything(process)
        process.communicate()
        rebuild()
    output = read_own_output(tmp_path, 0)
    assert re.search(r"elastic: ranks 2, 3 gone: 4 -> 2 ranks; back to step \d+", output), output[-3000:]
    went_on = float(re.search(r"first step after the change done at ([\d.]+)", output).group(1))
    assert went_on - vanished < 15, output[-3000:]
    assert "final " in output and "on 2 ranks" in output, output[-3000:]


def _torchrun_on_hosts(args: list[str], rendezvous: list[str], bound: float = BOUND_S) -> list[str]:
    """``torchrun --nnodes 2 --nproc-per-node 2 RENDEZVOUS ARGS`` on ringh1 and ringh2 (each in its host,
    with its hostname, as one node of a job); their outputs."""
    jobs = []
    for node, host in enumerate(HOSTS[:2]):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                    "--node-rank", str(node), *rendezvous, *args]
        jobs.append(subprocess.Popen(["ip", "netns", "exec", host, "unshare", "-ui", "sh", "-c",
                                      f'hostname {host}; exec "$@"', "sh", *torchrun], cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True))
    return [finish(job, bound).stdout for job in jobs]


_GLOO_ACROSS_HOSTS: dict = {}   # gloo's run of torchrun_ddp.py on the two hosts, made once (the reference)


def _gloo_across_hosts(rendezvous: list[str], folder) -> tuple[list[str], np.ndarray]:
    """gloo's outputs and parameters for torchrun_ddp.py at 2 x 2, run by the first test that asks, under
    its rendezvous: what gloo computes depends on each rank's data, which depends on its rank alone,
    not on how the ranks met (a second run under the other rendezvous gave the same lines and bits)."""
    if not _GLOO_ACROSS_HOSTS:
        outputs = _torchrun_on_hosts(["tests/programs/torchrun_ddp.py", "gloo", str(folder / "gloo.npy")], rendezvous)
        _GLOO_ACROSS_HOSTS.update(outputs=outputs, parameters=np.load(folder / "gloo.npy"))
    return _GLOO_ACROSS_HOSTS["outputs"], _GLOO_ACROSS_HOSTS["parameters"]


@pytest.mark.parametrize("rendezvous", [["--master-addr", "169.254.100.1", "--master-port", "29800"],
                                        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "169.254.100.1:29801",
                                         "--rdzv-id", "ringjob"]], ids=["static", "c10d"])
def test_torchrun_across_two_hosts_forms_one_world_and_gives_glooss_results(cluster, rendezvous, tmp_path):
    """2 hosts x 2 workers under torchrun (issue 59): the runtime's PMI server on host 1 forms MPICH's
    world across both (shared memory within a host, the network between); DDP's integers equal gloo's,
    its parameters within float32's rounding (4 ranks add in another order), and python -m collectives
    sees the two hosts. gloo, the reference, runs once for both rendezvous (_gloo_across_hosts)."""
    pytest.importorskip("torch")
    ring = _torchrun_on_hosts(["tests/programs/torchrun_ddp.py", "ring", str(tmp_path / "ring.npy")], rendezvous)
    gloo, gloo_parameters = _gloo_across_hosts(rendezvous, tmp_path)
    lines = r"rank (\d) of 4: ints (\[[\d, ]+\]) parameters"
    ours, theirs = (dict(re.findall(lines, "".join(outputs))) for outputs in (ring, gloo))
    assert sorted(ours) == ["0", "1", "2", "3"] and ours == theirs, ring + gloo
    np.testing.assert_allclose(np.load(tmp_path / "ring.npy"), gloo_parameters, rtol=1e-5, atol=1e-6)
    report = "".join(_torchrun_on_hosts(["-m", "collectives"], rendezvous))
    assert re.search(r"launched by torchrun \(WORLD_SIZE=4\), MPI's world formed through the runtime's PMI server "
                     r"at 169\.254\.100\.1:\d+: 4 rank\(s\) on 2 host\(s\): ringh1 ranks 0, 1; ringh2 ranks 2, 3",
                     report) and "every result equal to MPI's" in report, report
