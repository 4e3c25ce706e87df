"""PyTorch's own distributed test suite (``DistributedTest._DistTestBase``, shipped in the wheel as
``torch.testing._internal.distributed.distributed_test``) run under ``mpiexec`` on the "ring"
backend and on gloo, one fresh world per test.

Each rank does what torch's ``TestDistBackend._run`` does in each process that torch's
``MultiProcessTestCase`` spawns, with its rank and the world size from MPI::

    mpiexec -n 2 python -m tests.torch_suite --backend ring test_all_reduce_sum

The parent side (``Zygote``, ``run_test``) launches one world per test under a wall-clock bound
(a hang fails the test and the whole world is killed) and reads the ranks' exit codes as torch's
``MultiProcessTestCase._check_return_codes`` does. ``scripts/torch_suite.py`` is its command line,
``tests/test_torch_suite.py`` its pytest tier (ring against gloo at n=2).

Fresh processes. Importing torch and the suite takes 3-4 s a process, more than most tests; so a
zygote (``--serve``) imports them once, and each rank of each world is a child it forks for that
world alone: mpiexec starts a small client per rank (``python -S -m tests.torch_suite --client``)
that hands the zygote its standard streams and its PMI connection (MPICH's PMI_FD) and leaves with
the child's exit code; the child initialises MPI, runs the test and exits (the zygote kills it if
its client is killed). A test thus starts in the state a fresh interpreter has after the imports,
as under torch's spawn. Without PMI_FD (another MPI) the client becomes the plain runner;
``scripts/torch_suite.py --fresh-interpreters`` starts every rank as a new Python (~1 s a world
becomes ~5 s, more on a loaded machine).

Gating. The suite chooses its tests by backend name: decorators such as
``skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)`` and ``require_backend_is_available``
are evaluated once, when the module is imported, from the environment variable BACKEND, and the
test bodies take their CPU paths on ``BACKEND == "gloo"``. Both backends are therefore run with
BACKEND=gloo, so ring is offered exactly the tests gloo is and runs the same bodies; the
process group, though, is made with the backend asked for: on ring, every
``dist.init_process_group`` that passes the suite's BACKEND (``TestDistBackend._run`` itself,
and the suite's re-inits at distributed_test.py:872 and :9907) gets "ring". What a test asks
torch at run time (``dist.get_backend()``) is the truth, "ring"; tests that compare it with a
name, and torch's functions that accept only gloo, are listed in tests/test_torch_suite.py.

A rank that ends a test with torch's error code (10) or any other failure aborts the MPI world,
as torch's parent terminates the remaining processes; a skip (TEST_SKIPS' exit codes) or a pass
leaves normally.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

GATED_AS = "gloo"                      # the name the suite's gating sees, whatever the backend
BACKENDS = ("gloo", "ring")
DEFAULT_BOUND_S = 60.0
BARRIER_POLL_S = 0.002                 # how often torch's file barrier looks for its peers (it: 0.1 s)
TEST_ERROR_EXIT_CODE = 10              # MultiProcessTestCase.TEST_ERROR_EXIT_CODE
# TestDistBackend.setUp (distributed_test.py:581): torch checks no exit code for these tests.
SKIP_RETURN_CODE_CHECKS = frozenset({"test_ddp_has_finalized"})
SUITE = "torch.testing._internal.distributed.distributed_test"


def suite_environment(root: Path, world_size: int) -> dict[str, str]:
    """The environment torch's test runner gives each process of a test (run_test.py, and
    ``initialize_temp_directories`` and ``TestDistBackend.setUpClass`` in the parent)."""
    temp = root / "temp"
    return {"BACKEND": GATED_AS, "WORLD_SIZE": str(world_size), "TEMP_DIR": str(temp),
            "INIT_METHOD": f"file://{temp / 'init_dir' / 'shared_init_file'}", "MASTER_ADDR": "127.0.0.1"}


def prepare_folder(root: Path) -> Path:
    """A test's files, made once per world: TEMP_DIR with barrier/, test_dir/, init_dir/ (as
    ``initialize_temp_directories``), and the file of the ``file://`` rendezvous (``self.file_name``)."""
    for sub in ("barrier", "test_dir", "init_dir"):
        (root / "temp" / sub).mkdir(parents=True, exist_ok=True)
    init_file = root / "init_file"
    init_file.touch()
    return init_file


# ----------------------------------------------------------------------------------------------
# Per rank: python -m tests.torch_suite --backend ring|gloo TEST...  (under mpiexec)
# ----------------------------------------------------------------------------------------------

class _Log:
    """torch's harness logs a test's skip reason at INFO (common_distributed.py:1059): keep it.
    (Its errors torch's own logging prints, with the rank.)"""

    def __init__(self):
        import logging

        class Handler(logging.Handler):
            def emit(handler, record):
                if record.args and "skipping test" in str(record.msg):
                    self.skip_reason = str(record.args[-1])

        self.skip_reason = ""
        logging.getLogger("torch.testing._internal.common_distributed").addHandler(Handler(logging.INFO))


def _gate_then_import(world_size: int):
    """The suite, its gating evaluated as for gloo at this world size (once per process: a forked
    child finds it imported by the zygote, for the zygote's world size)."""
    global _GATED_FOR
    if _GATED_FOR not in (None, world_size):
        raise RuntimeError(f"the suite was imported (and gated) for world size {_GATED_FOR}, not {world_size}")
    os.environ["BACKEND"] = GATED_AS
    os.environ["WORLD_SIZE"] = str(world_size)
    import importlib
    suite = importlib.import_module(SUITE)
    _GATED_FOR = world_size
    return suite


_GATED_FOR: int | None = None


def _case_class(suite):
    """The class torch's test_distributed_spawn.py makes for gloo (``TestDistBackendWithSpawn``),
    less the spawning, which mpiexec does."""
    return type("TestDistBackendUnderMPI", (suite.TestDistBackend, suite.DistributedTest._DistTestBase), {})


def _init_as(backend: str, suite) -> None:
    """On ring, an ``init_process_group`` that passes the suite's BACKEND (gloo, for the gating) gets
    "ring": ``TestDistBackend._run`` (distributed_test.py:611) and the suite's re-inits (:872, :9907)."""
    import torch.distributed as dist
    if backend == GATED_AS:
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") == suite.BACKEND:
            kwargs["backend"] = backend
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group


def _poll_barrier_every(seconds: float, suite) -> None:
    """torch's file barrier (``Barrier.sync``: ``_DistTestBase._barrier`` at each test's start and
    end, and in some bodies) looks for its peers' files every 100 ms, which was a fifth of a quick
    test's time here. The same barrier (its files, its lock, its ids and timeout), looking every
    ``seconds``: a test then waits for its peers, not for the next look."""
    import torch.distributed as dist

    def sync(cls, wait_for=None, timeout=10):
        expected = dist.get_world_size() if wait_for is None else wait_for
        cls.barrier_id += 1
        folder = Path(os.environ["TEMP_DIR"]) / "barrier"
        with suite._lock():
            (folder / str(os.getpid())).write_text(str(cls.barrier_id))
        deadline = time.monotonic() + timeout
        while True:
            with suite._lock():
                arrived = sum(int((folder / peer).read_text()) >= cls.barrier_id for peer in os.listdir(folder))
            if arrived == expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("barrier timeout")
            time.sleep(seconds)

    suite.Barrier.sync = classmethod(sync)


def _run_one(case, rank: int, name: str, init_file: Path, log: _Log) -> tuple[int, str]:
    """torch's ``TestDistBackend._run(rank, name, file_name, pipe)`` in this process: its exit code
    and the error it reported (run_test sends the traceback through the pipe) or raised."""
    import torch.multiprocessing as mp
    ours, theirs = mp.Pipe()
    errors: list[str] = []

    def drain():
        try:
            while True:
                errors.append(str(ours.recv()))
        except (EOFError, OSError):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    log.skip_reason = ""
    try:
        case._run(rank, name, str(init_file), theirs)
        code = 0
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    except BaseException:   # noqa: BLE001 - a spawned process would die of it with exit code 1
        code = 1
        errors.append(traceback.format_exc())
        sys.stderr.write("".join(f"rank {rank}: {line}\n" for line in errors[-1].rstrip().splitlines()))
    theirs.close()
    reader.join(timeout=2)
    return code, "\n".join(errors)


def run_rank(backend: str, names: list[str]) -> int:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    given = os.environ.get("TORCH_SUITE_DIR")
    base = Path(given) if given else Path(comm.bcast(tempfile.mkdtemp(prefix="torch_suite.") if rank == 0 else None))
    folders = {name: base if given and len(names) == 1 else base / name for name in names}
    os.environ.update(suite_environment(folders[names[0]], size))
    suite = _gate_then_import(size)
    if backend == "ring":
        import collectives.torch  # noqa: F401 - registers "ring"
    from torch.testing._internal.common_distributed import TEST_SKIPS
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    _init_as(backend, suite)
    _poll_barrier_every(BARRIER_POLL_S, suite)
    case, log = _case_class(suite), _Log()
    codes = []
    for name in names:
        root = folders[name]
        if rank == 0:
            prepare_folder(root)
        comm.Barrier()
        init_file = root / "init_file"
        os.environ.update(suite_environment(root, size))
        suite.INIT_METHOD = os.environ["INIT_METHOD"]      # (the module read it at import)
        began = time.monotonic()
        if os.environ.get("TORCH_SUITE_PLANT_HANG") == str(rank):
            time.sleep(3600)            # (planted by tests/test_torch_suite.py: a hung world must be killed)
        code, error = _run_one(case, rank, name, init_file, log)
        result = {"rank": rank, "test": name, "backend": backend, "code": code, "error": error,
                  "skip_reason": log.skip_reason, "seconds": round(time.monotonic() - began, 3)}
        (root / f"result.{rank}.tmp").write_text(json.dumps(result))
        os.replace(root / f"result.{rank}.tmp", root / f"result.{rank}.json")   # whole or not at all
        why = log.skip_reason or skip_codes.get(code, "")
        print(f"torch_suite: rank {rank}: {name} on {backend}: exit {code}" + (f" (skip: {why})" if why else ""),
              flush=True)
        codes.append(code)
        if code != 0 and code not in skip_codes and name not in SKIP_RETURN_CODE_CHECKS:
            sys.stdout.flush()
            sys.stderr.flush()
            comm.Abort(code)             # as torch's parent terminates the remaining processes
    comm.Barrier()
    if not given and rank == 0:
        shutil.rmtree(base, ignore_errors=True)
    return codes[0] if len(codes) == 1 else 0


def list_rank(world_size: int) -> dict:
    """The suite's tests as unittest finds them, each with its skip decided at import (the gating)."""
    import unittest
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(suite_environment(Path(scratch), world_size))
        suite = _gate_then_import(world_size)
    from torch.testing._internal.common_distributed import TEST_SKIPS
    base = suite.DistributedTest._DistTestBase
    tests = []
    for name in unittest.TestLoader().getTestCaseNames(base):
        method = getattr(base, name)
        skipped = getattr(method, "__unittest_skip__", False)
        tests.append({"name": name, "skip": (getattr(method, "__unittest_skip_why__", "") or "skipped")
                      if skipped else None,
                      "pg_timeout": suite.CUSTOM_PG_TIMEOUT.get(name, suite.default_pg_timeout),
                      "slow": suite.CUSTOM_PG_TIMEOUT.get(name, 0) > suite.default_pg_timeout})
    return {"world_size": world_size, "gated_as": GATED_AS, "tests": tests,
            "skips": {str(s.exit_code): s.message for s in TEST_SKIPS.values()}}


# ----------------------------------------------------------------------------------------------
# Fresh processes without a fresh interpreter: a zygote that has imported torch and the suite forks
# one child per rank of each world; the rank that mpiexec starts is a small client that hands the
# zygote its standard streams and its PMI connection, and leaves with the child's exit code.
# ----------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (the driver for the zygote, the zygote for a child)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)          # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def serve(path: str, world_size: int) -> int:
    """``python -m tests.torch_suite --serve SOCKET --world-size N``: import torch and the suite (gated as
    for gloo at N ranks), print the catalogue as one JSON line, then fork a child for every client.
    It never returns; a child leaves through ``_leave``."""
    import gc
    import select
    import socket
    _die_with_parent()
    catalogue_now = list_rank(world_size)
    import torch.multiprocessing  # noqa: F401 - (what every child needs, imported once)
    import collectives.torch  # noqa: F401 - (ring's children need it: 0.15 s each; it starts no MPI, no thread)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    gc.freeze()        # (the children's collections then leave the zygote's objects, and their pages, alone)
    print(json.dumps(catalogue_now), flush=True)
    children: dict[socket.socket, int] = {}      # a client's connection: the pid of the child serving it
    while True:
        readable = select.select([listener, *children], [], [], 0.01)[0]   # (0.01: how soon an exit is seen)
        for ready in readable:
            if ready is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 8)
                if not message:                       # (a client killed before it asked)
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children:
                        other.close()
                    _leave(_child(conn, fds, json.loads(message)))
                for fd in fds:
                    os.close(fd)
                children[conn] = pid
            elif not ready.recv(1):                   # the client is gone (mpiexec killed it): so is its child
                _kill(children[ready])
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = next((c for c, p in children.items() if p == pid), None)
            if conn is None:
                continue
            del children[conn]
            try:
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass                                     # (its client is gone)
            conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _child(conn, fds: list[int], request: dict) -> int:
    """A rank: the client's streams on 0, 1, 2, its environment and PMI connection, then ``run_rank``.
    The zygote kills it when its client dies (mpiexec killed it: an abort, or the driver's bound);
    it dies with the zygote."""
    _die_with_parent()
    for target, fd in zip((0, 1, 2), fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if len(fds) > 3:
        os.environ["PMI_FD"] = str(fds[3])
    conn.close()
    try:
        return run_rank(request["backend"], request["tests"])
    except SystemExit as leaving:
        return leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    except BaseException:   # noqa: BLE001 - as an uncaught exception ends a process
        traceback.print_exc()
        return 1


def _leave(code: int) -> None:
    """A child's exit: what a process's normal exit does that matters here (atexit handlers, the
    runtime's among them; MPI_Finalize), without tearing down the modules it shares with the zygote,
    which would copy every page of them (seconds)."""
    import atexit
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def client(path: str, backend: str, tests: list[str]) -> int:
    """``python -S -m tests.torch_suite --client SOCKET --backend B TEST``, started by mpiexec: has the
    zygote fork this rank, and leaves with its exit code. Without a PMI file descriptor (not MPICH's
    hydra) it becomes the plain runner instead."""
    import socket
    if "PMI_FD" not in os.environ:
        os.execv(sys.executable, [sys.executable, "-m", "tests.torch_suite", "--backend", backend, *tests])
    fds = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    request = {"backend": backend, "tests": tests, "env": dict(os.environ)}
    socket.send_fds(sock, [json.dumps(request).encode()], fds + [int(os.environ["PMI_FD"])])
    reply = sock.recv(64)
    return int(reply) if reply else 1


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torch_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, help="the backend whose process group the tests run on")
    parser.add_argument("--list", type=int, metavar="N", help="print the tests and their gating at world size N "
                        "as JSON (no MPI)")
    parser.add_argument("--serve", metavar="SOCKET", help="be the zygote for worlds of --world-size ranks")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--client", metavar="SOCKET", help="have the zygote at SOCKET fork this rank")
    parser.add_argument("tests", nargs="*", help="test methods of DistributedTest._DistTestBase; more than one "
                        "run one after another in this world (only one per world is fresh state)")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps(list_rank(args.list)))
        return 0
    if args.serve:
        return serve(args.serve, args.world_size)
    if not args.backend or not args.tests:
        parser.error("--backend and at least one test are needed (or --list N)")
    if args.client:
        return client(args.client, args.backend, args.tests)
    return run_rank(args.backend, args.tests)


# ----------------------------------------------------------------------------------------------
# Parent side: one world per test, its outcome
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    test: str
    backend: str
    status: str                 # PASS, FAIL or SKIP
    reason: str = ""            # the skip's message, or the failure in one line
    seconds: float = 0.0
    output: str = ""            # what the world printed (kept for a failure)

    def line(self) -> str:
        if self.status == "SKIP":
            return f"{self.test} [{self.backend}]: SKIP({self.reason})"
        return (f"{self.test} [{self.backend}]: {self.status} ({self.seconds:.1f} s)"
                + (f": {self.reason}" if self.reason else ""))

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


class Zygote:
    """The parent's handle on a zygote (``--serve``) for worlds of n ranks: its catalogue, the
    arguments that have mpiexec start a client of it, and its end (also when this process dies)."""

    def __init__(self, n: int, start_timeout_s: float = 300):
        import select
        from tests.worlds import ROOT
        self.n = n
        self.folder = tempfile.mkdtemp(prefix="torch_suite_zygote.")
        self.path = os.path.join(self.folder, "socket")
        self.log = open(os.path.join(self.folder, "log"), "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.torch_suite", "--serve", self.path, "--world-size", str(n)], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
            stderr=self.log, text=True)
        if not select.select([self.process.stdout], [], [], start_timeout_s)[0]:
            self.close()
            raise RuntimeError(f"the zygote did not start in {start_timeout_s:.0f} s")
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            error = self.log.read()[-3000:]
            self.close()
            raise RuntimeError(f"the zygote failed to start:\n{error}")
        self.catalogue = json.loads(line)

    def args(self, backend: str, test: str) -> list[str]:
        if self.process.poll() is not None:
            raise RuntimeError(f"the zygote died (exit status {self.process.returncode})")
        return ["-S", "-m", "tests.torch_suite", "--client", self.path, "--backend", backend, test]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def catalogue(n: int) -> dict:
    """``python -m tests.torch_suite --list n``: the tests and, for each, its skip at import."""
    from tests.worlds import ROOT
    done = subprocess.run([sys.executable, "-m", "tests.torch_suite", "--list", str(n)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"listing torch's distributed tests failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exception_line(text: str) -> str:
    """The line that names the exception of the last traceback in ``text`` (the first unindented line
    after its frames), else the last line."""
    lines = [line for line in text.splitlines() if line.strip()]
    found, in_frames = "", False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_frames = True
        elif in_frames and not line[0].isspace():
            found, in_frames = line, False
    found = found or (lines[-1] if lines else "")
    return found if len(found) <= 300 else found[:297] + "..."


def run_test(n: int, backend: str, test: dict, skips: dict[str, str], bound_s: float = DEFAULT_BOUND_S,
             zygote: Zygote | None = None, env: dict[str, str] | None = None) -> Outcome:
    """One test of the catalogue in a fresh world of n ranks on ``backend``, bounded by ``bound_s``
    (for a test to which torch gives a longer process-group timeout, that plus 30 s): its ranks forked
    by ``zygote``, else each a new interpreter (``python -m tests.torch_suite``)."""
    from tests.worlds import run_world
    name = test["name"]
    if test["skip"] is not None:
        return Outcome(name, backend, "SKIP", test["skip"])
    bound = max(bound_s, test["pg_timeout"] + 30) if test["slow"] else bound_s    # (torch gives it more time)
    # (a rank of an aborted world may write its result while the zygote kills it: hence ignore_cleanup_errors)
    with tempfile.TemporaryDirectory(prefix="torch_suite.", ignore_cleanup_errors=True) as scratch:
        began = time.monotonic()
        args = zygote.args(backend, name) if zygote else ["-m", "tests.torch_suite", "--backend", backend, name]
        world = run_world(n, args, bound, env={**(env or {}), "TORCH_SUITE_DIR": scratch})
        seconds = time.monotonic() - began
        results = {}
        for r in range(n):
            path = Path(scratch) / f"result.{r}.json"
            if path.exists():
                results[r] = json.loads(path.read_text())   # (written whole: see run_rank)
    return judge(name, backend, n, results, world.returncode, world.stdout, seconds, skips)


def judge(name, backend, n, results, returncode, output, seconds, skips) -> Outcome:
    """The outcome as ``MultiProcessTestCase._check_return_codes`` reads the exit codes, stricter in one
    way: a rank that leaves with a code that is neither 0 nor a skip fails the test (torch looks
    only at rank 0's code, unless it is the error code 10)."""
    def outcome(status, reason=""):
        return Outcome(name, backend, status, reason, seconds, output if status == "FAIL" else "")

    errored = [res for res in results.values() if res["code"] == TEST_ERROR_EXIT_CODE]
    if errored:
        return outcome("FAIL", f"rank {errored[0]['rank']}: {exception_line(errored[0]['error'])}")
    if returncode == -9:                        # (run_world's: past the bound, the world was killed)
        missing = [r for r in range(n) if r not in results]
        return outcome("FAIL", f"hung: killed after {seconds:.0f} s, "
                               + (f"no result from rank(s) {missing}" if missing else "after every rank's result"))
    if name in SKIP_RETURN_CODE_CHECKS:
        return outcome("PASS")
    first = results.get(0)
    if first is not None and str(first["code"]) in skips:
        message = skips[str(first["code"])]
        return outcome("SKIP", first["skip_reason"] or message)
    bad = [res for res in results.values() if res["code"] != 0 and str(res["code"]) not in skips]
    missing = [r for r in range(n) if r not in results]
    if bad:
        res = bad[0]
        return outcome("FAIL", f"rank {res['rank']} exited {res['code']}"
                               + (f": {exception_line(res['error'])}" if res["error"] else "")
                               + (f"; rank(s) {missing} still in the test when the world was aborted"
                                  if missing else ""))
    if missing:
        return outcome("FAIL", f"rank(s) {missing} ended without a result (mpiexec exit status {returncode})")
    return outcome("PASS")


if __name__ == "__main__":
    sys.exit(main())
