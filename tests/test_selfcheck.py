"""Tier 2: ``python -m collectives`` (issue 28): the installation described, and a self-check against mpi4py's
collectives that fails, naming the call, when a result is wrong."""
import os
import subprocess
import sys

import pytest

from tests.worlds import ROOT, mpi_name, run_world

MPI_NAME = mpi_name()   # the MPI whose launcher starts these worlds: each names itself its own way
LAUNCHED_BY = {"MPICH": "MPICH's or Intel MPI's mpiexec (PMI_SIZE", "Open MPI": "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE"}


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.quick), 3])
def test_it_describes_the_installation_and_checks_every_collective(n):
    result = run_world(n, ["-m", "collectives"], 120, env={"COLLECTIVES_TIMEOUT": "30"})
    out = result.stdout
    assert result.returncode == 0, out
    assert out.count(f"self-check: 23 calls on {n} rank(s) in ") == 1 and "every result equal to MPI's" in out, out
    assert out.count("ringcollectives ") == 1 and out.count(f"MPI: {MPI_NAME} ") == 1, out
    assert f"launched by {LAUNCHED_BY[MPI_NAME]}={n}): {n} rank(s) on 1 host(s)" in out, out
    settings = {line.split()[0]: line for line in out.splitlines() if line.startswith("  COLLECTIVES_")}
    assert len(settings) == 8, out
    assert settings["COLLECTIVES_TIMEOUT"].split()[1:] == ["30", "s", "environment", "(COLLECTIVES_TIMEOUT=30)"]
    assert settings["COLLECTIVES_CHECK"].split()[1:] == ["1", "default"]
    assert "GPU of rank 0: " in out and "the torch backend 'ring': " in out, out


def test_a_wrong_result_fails_the_check_and_is_named():
    planted = ("import sys, collectives as col, collectives.__main__ as about\n"
               "real = col.allgather\n"
               "col.allgather = lambda x, **kw: real(x, **kw) + (col.rank() == 1)\n"
               "sys.exit(about.main())\n")
    result = run_world(2, ["-c", planted], 120)
    assert result.returncode == 1, result.stdout
    assert "self-check: 23 calls on 2 rank(s)" in result.stdout and "2 wrong:" in result.stdout, result.stdout
    for count in (3, 131072):
        assert f"rank 1: allgather at {count} elements: not MPI's result" in result.stdout, result.stdout
    assert "rank 0: allgather" not in result.stdout


def test_without_a_launcher_it_says_so():
    result = subprocess.run([sys.executable, "-m", "collectives"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("PMI")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "launched by no launcher (a world of one rank): 1 rank(s) on 1 host(s)" in result.stdout, result.stdout



def _without_mpi_start(*args, rank="0"):
    """``python -m collectives ARGS`` as rank ``rank`` of a launcher's 2, whose MPI could never start
    (the PMI port leads nowhere): a run that ends cleanly and at once never tried to start it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_"))}
    env.update(PMI_SIZE="2", PMI_RANK=rank, PMI_PORT="127.0.0.1:1", COLLECTIVES_TIMEOUT="5")
    return subprocess.run([sys.executable, "-m", "collectives", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)


def test_help_says_what_it_does_and_starts_nothing():
    result = _without_mpi_start("--help")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage: python -m collectives"), result.stdout
    assert "self-check" in result.stdout and "mpiexec -n 4 python -m collectives" in result.stdout, result.stdout
    assert "self-check:" not in result.stdout and result.stderr == "", result.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_an_unknown_argument_is_refused_by_name_before_mpi_starts(rank):
    result = _without_mpi_start("--bogus", rank=rank)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "", result.stdout
    said = ["python -m collectives: error: unrecognized arguments: --bogus (it takes none but --help)"]
    assert result.stderr.splitlines() == (said if rank == "0" else []), result.stderr   # rank 0 alone says it
