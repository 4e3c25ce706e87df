"""Launch real MPI worlds from tests, always under a timeout, so a deadlock fails instead of hanging CI."""
from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: ``python`` arguments of a pytest run inside a world, before its paths: no cache (several ranks would write
#: it at once), and not hypothesis's plugin (tests/mpi has no use for it; importing it at the summary cost each
#: rank 0.3 s).
WORLD_PYTEST = ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]


#: MPICH's shared-memory segments (``/dev/shm/mpich_shm_*``) are unlinked once every rank of a host has
#: attached; a world killed before that (inside MPI_Init: a rank that never came, a world past its bound)
#: leaves them, a few MB each, until the machine restarts (6.3 GB after one suite). Open MPI's shared-memory
#: transport (``sm_segment.<host>.<uid>.<job>.<rank>``) is unlinked at its finalize: a killed rank leaves its own.
SHM = Path("/dev/shm")
SEGMENTS = ("mpich_shm_*", "sm_segment.*")
ORPHAN_AGE_S = 30.0   # (a segment this old that no process maps is no world's: a world maps it as it makes it)


def remove_orphan_segments(now: float | None = None, directory: Path = SHM) -> list[Path]:
    """Remove MPI's shared-memory segments (SEGMENTS) in ``directory`` that no live process maps and that
    are older than ORPHAN_AGE_S; return them. Cheap where there are none (one directory listing)."""
    now = time.time() if now is None else now
    try:
        old = [p for pattern in SEGMENTS for p in directory.glob(pattern) if now - p.stat().st_mtime > ORPHAN_AGE_S]
    except OSError:
        return []
    if not old:
        return []
    mapped = _mapped_files()
    removed = []
    for path in old:
        if str(path) not in mapped:
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def _mapped_files() -> set[str]:
    """Every file some process on this machine maps (read from /proc/*/maps)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            for line in maps.read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6:
                    mapped.add(fields[5].removesuffix(" (deleted)"))
        except OSError:
            pass
    return mapped


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses now (for a test's MASTER_PORT), below the kernel's
    ephemeral range: a port the kernel handed out could be handed again, as some other connection's
    own end, before the test's process listens on it."""
    try:
        lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lowest_ephemeral = 32768
    below = range(10000, lowest_ephemeral)
    for port in random.sample(below, min(200, len(below))) or [0]:   # (0: the kernel's choice, where none is below)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port below the ephemeral range")


@functools.lru_cache(maxsize=None)
def mpiexec() -> tuple[str, ...]:
    """The launcher that belongs to this Python's MPI: $MPIEXEC, the venv's, or the one on PATH.

    Open MPI refuses more ranks than cores, and root, unless told; MPICH needs neither flag.
    """
    beside_python = Path(sys.executable).parent / "mpiexec"
    exe = os.environ.get("MPIEXEC") or (str(beside_python) if beside_python.exists() else shutil.which("mpiexec"))
    if exe is None:
        raise RuntimeError("no mpiexec: install with the 'mpich' extra, or put your MPI's mpiexec on PATH")
    if _is_open_mpi(exe):
        return (exe, "--oversubscribe") + (("--allow-run-as-root",) if os.geteuid() == 0 else ())
    return (exe,)


@functools.lru_cache(maxsize=None)
def _is_open_mpi(exe: str) -> bool:
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return "Open MPI" in version or "OpenRTE" in version


def mpi_name() -> str:
    """"Open MPI" or "MPICH": whose launcher run_world uses (tests that see a launcher's own behaviour ask)."""
    return "Open MPI" if _is_open_mpi(mpiexec()[0]) else "MPICH"


def keep_survivors() -> tuple[str, ...]:
    """Launcher flags that leave the other ranks running when one dies, so that the runtime names it.

    MPICH: -disable-auto-cleanup. Open MPI 5 (prterun): a "recoverable" job (measured: without it
    prterun kills every rank within a second of a death, before any speaks; --with-ft ulfm makes MPI
    itself raise MPI_ERR_PROC_FAILED inside the runtime's calls instead, which the runtime does not use).
    """
    return ("--runtime-options", "recoverable") if mpi_name() == "Open MPI" else ("-disable-auto-cleanup",)


def killed_by_ctrl_c(status: int, output: str) -> bool:
    """Open MPI's mpiexec (prterun) does not pass a Ctrl-C on to the ranks: it kills them at once and exits
    with 1 (measured: no rank got a signal it could catch; --forward-signals SIGINT is refused). So under
    Open MPI, tests of what ranks do on Ctrl-C to mpiexec check that instead: True if that is what happened."""
    return status == 1 and "interrupted" not in output and "Traceback" not in output


def run_world(n: int, args: list[str], timeout: float, env: dict | None = None,
              launcher_args: tuple[str, ...] = (), python: bool = True) -> subprocess.CompletedProcess:
    """``mpiexec LAUNCHER_ARGS -n n python ARGS`` (``python=False``: ``... -n n ARGS``) from the
    repository root; kills the whole world on timeout."""
    command = [*mpiexec(), *launcher_args, "-n", str(n), *([sys.executable] if python else []), *args]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return subprocess.CompletedProcess(command, returncode=-9, stdout=f"TIMED OUT after {timeout}s\n{output}")
    return subprocess.CompletedProcess(command, process.returncode, stdout=output)
