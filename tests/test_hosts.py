"""Issue 25, first part: several hosts emulated on this machine (scripts/emulate_hosts.sh: a network
namespace per host, with its own hostname and IPC namespace, a bridge between them), the conformance
suite (tests/mpi) run across them at 2 x 2 (MPICH over UCX, and over libfabric's tcp) and at an
uneven 3 + 1. Needs root and MPICH; skipped with the reason elsewhere. Every run is bounded in time,
and the hosts are removed whatever happens (stale ones of a killed run first)."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.worlds import ROOT, mpiexec

SCRIPT = ROOT / "scripts" / "emulate_hosts.sh"
BOUND_S = 300
OFI_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def _why_not() -> str:
    if os.geteuid() != 0:
        return "emulating hosts needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "emulating hosts needs ip (iproute2) and unshare"
    if len(mpiexec()) != 1:
        return "the emulated hosts are started by MPICH's mpiexec (its -launcher-exec)"
    probe = subprocess.run(["ip", "netns", "add", "ringprobe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", "ringprobe"], capture_output=True)
    return "" if probe.returncode == 0 else f"cannot make a network namespace here: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def cluster():
    why = _why_not()
    if why:
        pytest.skip(why)
    subprocess.run([str(SCRIPT), "down"], check=True, timeout=60)
    try:
        subprocess.run([str(SCRIPT), "up", "3"], check=True, timeout=60, capture_output=True)
        yield
    finally:
        subprocess.run([str(SCRIPT), "down"], timeout=60)


def _run(layout: str, args: list[str], env: dict | None = None, python: bool = True) -> subprocess.CompletedProcess:
    """``emulate_hosts.sh run LAYOUT -- python ARGS`` (``python=False``: ``-- ARGS``, mpiexec's own
    options first) from the repository root, killed at BOUND_S."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [str(SCRIPT), "run", layout, "--", *([sys.executable] if python else []), *args]
    process = subprocess.Popen(command, cwd=ROOT, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        for host in ("ringh1", "ringh2", "ringh3"):   # (mpiexec's proxies lead sessions of their own)
            pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        output = f"TIMED OUT after {BOUND_S} s\n{process.communicate()[0]}"
        return subprocess.CompletedProcess(process.args, -9, stdout=output)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout=output)


def _tx_bytes(host: str) -> int:
    found = subprocess.run(["ip", "netns", "exec", host, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                           capture_output=True, text=True, timeout=30)
    return int(found.stdout)


@pytest.mark.parametrize("layout, netmod", [("2,2", "ucx"), ("2,2", "ofi-tcp"), ("3,1", "ucx")])
def test_ranks_know_their_hosts_and_the_bytes_cross_the_links(cluster, layout, netmod):
    before = _tx_bytes("ringh2")
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
    assert _tx_bytes("ringh2") - before > 1 << 20, "host 2 sent less than a chunk: shared memory, not the link?"


@pytest.mark.parametrize("layout, netmod", [("2,2", "ucx"), ("2,2", "ofi-tcp"), ("3,1", "ucx")])
def test_every_collective_matches_mpi4py_across_hosts(cluster, layout, netmod):
    """tests/mpi (every collective, op and dtype against mpi4py's own, async handles, groups,
    point-to-point, each algorithm forced) with its ranks on several hosts."""
    result = _run(layout, ["-m", "pytest", "tests/mpi", "--with-mpi", "-q", "-x", "-p", "no:cacheprovider",
                           "--timeout", "240"], OFI_TCP if netmod == "ofi-tcp" else None)
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("netmod", ["ucx"])
def test_a_rank_killed_on_another_host_is_named_by_every_survivor_on_both_hosts(cluster, netmod, tmp_path):
    """2 x 2 under -disable-auto-cleanup: rank 3 (host 2) is SIGKILLed while the others wait for it.
    Its host mate sees its process end; the ranks on host 1 hear it in that rank's farewell.
    Runs in which MPICH's launcher killed a survivor before it could speak are run again (see
    tests/test_edges.py::KILL_ATTEMPTS). Not over OFI tcp: there a rank's Isend to a peer on a host
    whose ranks are gone was seen to block inside libfabric (connecting) for minutes, 1 run in 3:
    issue 25's open part."""
    from tests.test_edges import KILL_ATTEMPTS, OWN_OUTPUT, _read
    for attempt in range(KILL_ATTEMPTS):
        directory = tmp_path / f"attempt{attempt}"
        directory.mkdir()
        env = {**(OFI_TCP if netmod == "ofi-tcp" else {}), "OWN_OUTPUT": str(directory / "out")}
        _run("2,2", ["-disable-auto-cleanup", str(OWN_OUTPUT), sys.executable, "-m", "tests.programs.edges",
                     "killed", "waiting", "3"], env, python=False)
        outputs = {r: _read(directory, r) for r in range(3)}
        if all("program ended" in output for output in outputs.values()):
            break
    for rank, output in outputs.items():
        found = re.search(rf"rank {rank}: CollectiveError after ([\d.]+) s in call 2: allreduce #7 on rank {rank}: "
                          r"rank 3 is gone: its process \(pid \d+ on host ringh2\) ended without leaving the runtime",
                          output)
        assert found and float(found.group(1)) < 5, outputs
        assert (rank == 2) == ("seen by" not in output), outputs   # host 1 heard it from rank 2
        assert "exiting with status 1 without MPI_Finalize" in output and "Fatal Python error" not in output, outputs
