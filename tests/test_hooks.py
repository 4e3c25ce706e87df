"""Tier 2, issue 37, item 4: nothing at import. Importing ``collectives`` (or ``collectives.torch``)
installs no excepthook, exit handler or signal handler, and a program that never calls it exits at
once; the program's first use installs them, and leaving the runtime (MPI.Finalize() by the
program, or the exit) removes them. ``import collectives.torch`` starts no MPI; without MASTER_ADDR
its rendezvous answers env:// and ring:// (``collectives/torch/rendezvous.py``). (A rank that used the runtime and ends before its first collective
is still named by the others: tests/test_edges.py and tests/test_faults.py.)"""
import os
import re
import subprocess
import sys

import pytest

from tests.worlds import ROOT, run_world


BOUND_S = 60
NOTHING = "excepthook original, exit handlers +0, SIGUSR1 default"


@pytest.mark.parametrize("module", ["collectives", "collectives.torch"])
def test_a_program_that_only_imports_the_package_gets_no_hooks_and_exits_at_once(module, tmp_path):
    if module == "collectives.torch":
        pytest.importorskip("torch")
    result = run_world(2, ["-m", "tests.programs.hooks", "import-only", module, str(tmp_path / "rank-1-ended")],
                       BOUND_S)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        assert f"rank {rank}: after import: {NOTHING}" in result.stdout, result.stdout
        took = re.search(rf"rank {rank}: exit handlers after the program's end took ([\d.]+) s", result.stdout)
        # The time is the promise: rank 0 ends its program only once rank 1's exit handlers have run,
        # so an exit handler that waited for the other rank would wait on rank 1 until rank 0 gave up
        # (30 s, then status 4); none takes milliseconds. The bound leaves room for a loaded machine
        # (and "exit handlers +0" above says none was installed).
        assert took and float(took.group(1)) < 1.0, result.stdout


@pytest.mark.parametrize("ending, last", [
    ("finalize", "after MPI.Finalize(): excepthook original, exit handlers +0, SIGUSR1 ignored"),
    ("exit", "at exit: excepthook original, exit handlers +0, SIGUSR1 ignored"),
    ("foreign", "at exit: excepthook the program's own, exit handlers +0, SIGUSR1 ignored"),
])
def test_the_first_use_installs_the_hooks_and_leaving_the_runtime_removes_them(ending, last):
    result = run_world(2, ["-m", "tests.programs.hooks", "first-use", ending], BOUND_S)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        for look in (f"after import: {NOTHING}",
                     "after rank(): excepthook replaced, exit handlers +1, SIGUSR1 handled",   # (from MPI's start)
                     "after a collective: excepthook replaced, exit handlers +1, SIGUSR1 handled", last):
            assert f"rank {rank}: {look}" in result.stdout, (look, result.stdout)


def test_without_master_addr_env_and_ring_urls_are_the_ring_rendezvous_and_gloo_is_told_what_to_set():
    pytest.importorskip("torch")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "tests.programs.hooks", "torch-env"], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=BOUND_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0: after import: MPI not started" in result.stdout, result.stdout + result.stderr
    assert re.search(r"rank 0: gloo None: RuntimeError: the ring rendezvous .* keeps no key-value store .* needs "
                     r"MASTER_ADDR and MASTER_PORT set", result.stdout), result.stdout + result.stderr
    assert "rank 0: ring None: rank 0 of 1" in result.stdout, result.stdout
    assert "rank 0: ring ring://: rank 0 of 1" in result.stdout, result.stdout
