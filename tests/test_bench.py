"""Tier 2: `mpiexec -n N python -m bench`, run as users run it: its table, JSON, CSV, plot and exit status.

Small sweeps only: the bench's figures are measured by running it, never asserted here.
"""
import csv
import os
import re
import signal
import subprocess
import sys

import pytest

from ring import cost
from ring.transport.host_waits import usable_cores
from tests.support.bench import QUICK, TIMEOUT_S, bench, rows_of
from tests.worlds import ROOT, killed_by_ctrl_c, mpi_name, mpiexec, run_world


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_sweep_writes_a_table_json_csv_and_plot_with_nothing_wrong(n, tmp_path):
    out = {kind: tmp_path / f"bench.{kind}" for kind in ("json", "csv", "png")}
    result = bench(n, "--json", str(out["json"]), "--csv", str(out["csv"]), "--plot", str(out["png"]))
    assert result.returncode == 0, result.stdout[-4000:]
    environment, rows = rows_of(out["json"])
    sizes = [8, 128, 2048, 32768]
    assert [(r["impl"], r["bytes"]) for r in rows] == [(impl, s) for s in sizes for impl in ("ring", "mpi")]
    assert all(r["wrong"] == 0 and r["n"] == n and r["time_us"] > 0 and r["op"] == "allreduce" for r in rows)
    assert environment["n"] == n and "MPI" in environment["mpi_library"] and environment["memcpy_gbps"] > 0
    for r in rows:
        assert r["algbw"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (n - 1) / n)
    with open(out["csv"]) as stream:
        assert [(r["impl"], int(r["bytes"])) for r in csv.DictReader(stream)] == [(r["impl"], r["bytes"]) for r in rows]
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out["png"].stat().st_size > 10_000
    table = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(table) == len(sizes) and "#wrong: 0 (every result exact)" in result.stdout
    assert result.stdout.count("memcpy reference") == 1   # only rank 0 prints


@pytest.mark.parametrize("op,flags", [("reduce_scatter", ["--dtype", "int8", "--redop", "max"]),
                                      ("allgather", ["--dtype", "uint16"]),
                                      ("broadcast", ["--dtype", "float64", "--root", "2"]),
                                      ("allreduce", ["--dtype", "float16", "--redop", "avg"])])
def test_every_collective_runs_exact_on_an_odd_world(op, flags, tmp_path):
    result = bench(3, "--op", op, *flags, "--json", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stdout[-4000:]
    _, rows = rows_of(tmp_path / "b.json")
    assert rows and all(r["wrong"] == 0 and r["op"] == op for r in rows)
    if op in ("reduce_scatter", "allgather"):
        assert all(r["count"] % 3 == 0 for r in rows)   # sizes round down to split evenly, as in nccl-tests


# (ids other than "mpi": pytest-mpi would take that id for its marker and skip the test)
@pytest.mark.parametrize("planted", ["ring", "mpi"], ids=["in-ring", "in-MPI"])
def test_a_wrong_element_shows_in_wrong_and_in_the_exit_status(planted, tmp_path):
    result = bench(2, "--plant-error", planted, "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1, result.stdout[-4000:]
    _, rows = rows_of(tmp_path / "b.json")
    assert all(r["wrong"] == (1 if r["impl"] == planted else 0) for r in rows), rows
    assert "RESULTS ARE WRONG" in result.stdout


def test_impl_picks_a_subset():
    result = bench(2, "--impl", "ring")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "mpi: time" not in result.stdout and "ring: time" in result.stdout


@pytest.mark.parametrize("flags,message", [(["--max-bytes", "64Q"], "not a size: '64Q'"),
                                           (["--min-bytes", "1M"], "--max-bytes (65536) is below --min-bytes"),
                                           (["--root", "5"], "--root 5 is out of range for 2 ranks"),
                                           (["--redop", "avg", "--dtype", "int32"], "--redop avg needs a floating"),
                                           (["--json", "/no/such/dir/b.json"], "--json /no/such/dir/b.json"),
                                           (["--op", "alltoall"], "invalid choice: 'alltoall'"),
                                           (["--link", "25GB/s,5us"], "--link and --hosts describe the predictions"),
                                           (["--model", "--link", "fast"], "expected BANDWIDTH,LATENCY like 25GB/s,5us"),
                                           (["--model", "--hosts", "8"], "expected HOSTSxRANKS like 512x8"),
                                           (["--model", "--impl", "mpi"], "--model times the host algorithms alone"),
                                           (["--op", "allgather", "--redop", "avg"], "--redop avg: allgather does not reduce")])
def test_bad_arguments_are_named_once_and_exit_2(flags, message):
    result = bench(2, *flags, timeout=60)
    assert result.returncode == 2, result.stdout[-2000:]
    assert result.stdout.count(message) == 1, result.stdout[-2000:]


def _before_mpi(*flags, rank="0"):
    """``python -m bench FLAGS`` as rank ``rank`` of a launcher's 2, whose MPI could never start (the
    PMI port leads nowhere): a run that ends cleanly and at once never tried to start it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_"))}
    env.update(PMI_SIZE="2", PMI_RANK=rank, PMI_PORT="127.0.0.1:1", COLLECTIVES_TIMEOUT="5")
    return subprocess.run([sys.executable, "-m", "bench", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("flags,message", [(["--factor", "1"], "--factor must be > 1, got 1"),
                                           (["--root", "5"], "--root 5 is out of range for 2 ranks"),
                                           (["--root", "-1"], "--root -1 is out of range for 2 ranks"),
                                           (["--min-bytes", "1M", "--max-bytes", "4K"],
                                            "--max-bytes (4096) is below --min-bytes (1048576)"),
                                           (["--min-bytes", "0"], "--min-bytes must be > 0"),
                                           (["--op", "allgather", "--redop", "avg"],
                                            "--redop avg: allgather does not reduce"),
                                           (["--op", "broadcast", "--redop", "sum"],
                                            "--redop sum: broadcast does not reduce")])
def test_what_can_be_checked_without_mpi_is_refused_before_it_starts(flags, message):
    said = _before_mpi(*flags)
    assert said.returncode == 2 and said.stdout == "", said.stdout + said.stderr
    lines = said.stderr.splitlines()   # one line, naming the flag
    assert len(lines) == 1 and lines[0].startswith(f"python -m bench: error: {message}"), said.stderr
    quiet = _before_mpi(*flags, rank="1")
    assert quiet.returncode == 2 and quiet.stdout + quiet.stderr == "", quiet.stderr


def test_a_root_beyond_a_world_the_launcher_did_not_announce_is_refused_before_any_timing():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_"))}
    said = subprocess.run([sys.executable, "-m", "bench", *QUICK, "--root", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert said.returncode == 2, said.stdout + said.stderr
    assert said.stderr.count("--root 1 is out of range for 1 ranks") == 1 and "memcpy" not in said.stdout, said


def test_the_sweeps_estimate_covers_what_it_does():
    """The header's estimate against the sweep's own time, at sizes where moving bytes is a small
    part of each iteration's work (resetting, calling, checking, the barriers)."""
    result = bench(2, "--min-bytes", "256K", "--max-bytes", "16M", "--factor", "4", "--iters", "30", "--warmup", "3")
    assert result.returncode == 0, result.stdout[-3000:]
    estimate = float(re.search(r"^# sweep: 4 sizes, .*; about ([\d.]+) s", result.stdout, re.M)[1])
    took = float(re.search(r"^# sweep took ([\d.]+) s", result.stdout, re.M)[1])
    assert took / 3 <= estimate <= took * 3, result.stdout


def test_plot_without_matplotlib_says_what_to_install_before_any_timing(tmp_path):
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    result = bench(2, "--plot", str(tmp_path / "b.png"), timeout=60,
                   env={"PYTHONPATH": f"{shim.parent}:{ROOT}"})
    assert result.returncode == 2, result.stdout[-2000:]
    assert 'pip install -e ".[plot]"' in result.stdout and "memcpy" not in result.stdout
    assert not (tmp_path / "b.png").exists()


def test_the_header_counts_cpus_per_host_and_warns_of_oversubscription():
    crowded = bench(3)
    assert crowded.returncode == 0 and " cpus per host;" in crowded.stdout and " cpus each" not in crowded.stdout
    cpus = len(os.sched_getaffinity(0))
    warned = crowded.stdout.count(f"# warning: 3 ranks share {cpus} usable cpus on a host")
    assert warned == (1 if cpus < 3 else 0), crowded.stdout
    assert "# sweep: 4 sizes, " in crowded.stdout and "; about " in crowded.stdout and "# sweep took " in crowded.stdout


def test_ranks_bound_to_a_core_each_are_not_called_oversubscribed():
    # Open MPI binds each of 2 ranks to a core of its own by default (not under --oversubscribe, which
    # run_world gives it): each may use 1 cpu, none shares it (the header counted 1 and warned; the
    # runtime polled as if oversubscribed). Asked to bind alike, both launchers.
    binding = ("--bind-to", "core") if mpi_name() == "Open MPI" else ("-bind-to", "core")
    shared = len(os.sched_getaffinity(0)) < 2
    result = run_world(2, ["-m", "bench", *QUICK], TIMEOUT_S, launcher_args=binding)
    assert result.returncode == 0, result.stdout[-2000:]
    assert ("# warning: 2 ranks share" in result.stdout) == shared, result.stdout
    # --model's warning under its fit counts the cpus alike (it counted the rank's own core and warned)
    fitted = run_world(2, ["-m", "bench", "--model", "--max-bytes", "32"], TIMEOUT_S, launcher_args=binding)
    assert fitted.returncode == 0 and "# fitted on this machine" in fitted.stdout, fitted.stdout[-2000:]
    assert ("# warning: 2 ranks share" in fitted.stdout) == shared, fitted.stdout


def test_the_cores_of_a_host_are_those_its_ranks_may_use_together():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 usable cores")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.sched_setaffinity(0, cores[:1])
        os.sched_setaffinity(child.pid, cores[1:2])
        assert usable_cores() == 1 and usable_cores([child.pid]) == 2
        os.sched_setaffinity(child.pid, cores[:1])   # both on one core: it is shared
        assert usable_cores([child.pid]) == 1
    finally:
        os.sched_setaffinity(0, cores)
        child.kill()
        child.wait()
    assert usable_cores([child.pid]) == len(cores)   # a pid gone counts nothing


def test_one_rank_shows_a_speed_ratio_not_a_busbw_ratio():
    result = bench(1)
    header = [line for line in result.stdout.splitlines() if line.startswith("#") and "(B)" in line][0]
    assert result.returncode == 0 and header.rstrip().endswith("speed"), header
    assert bench(2).stdout.count("|     busbw") == 1


def test_sizes_that_cannot_fit_in_memory_are_refused_before_any_timing():
    result = bench(2, "--min-bytes", "64G", "--max-bytes", "64G")
    assert result.returncode == 2 and result.stdout.count("--max-bytes 64G needs about 640.0 GiB of memory") == 1
    assert "float32" not in result.stdout and "Traceback" not in result.stdout


def test_ctrl_c_stops_every_rank_with_one_line_and_keeps_the_rows(tmp_path):
    out = tmp_path / "partial.json"
    job = subprocess.Popen([*mpiexec(), "-n", "2", sys.executable, "-m", "bench", "--max-bytes", "256M", "--no-gloo",
                            "--json", str(out)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seen = []
        while not seen or not seen[-1].strip().startswith("4096 "):
            seen.append(job.stdout.readline())
            assert seen[-1], "".join(seen)
        os.kill(job.pid, signal.SIGINT)   # as a terminal's Ctrl-C reaches mpiexec, which passes it on
        rest, _ = job.communicate(timeout=TIMEOUT_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    if mpi_name() == "Open MPI":
        assert killed_by_ctrl_c(job.returncode, rest), rest   # (it does not pass Ctrl-C on: tests.worlds)
        return
    assert job.returncode == 130, rest
    assert rest.count("# interrupted (Ctrl-C or SIGTERM) after ") == 1 and "Traceback" not in rest, rest
    done = int(rest.split("# interrupted (Ctrl-C or SIGTERM) after ")[1].split()[0])
    _, rows = rows_of(out)
    assert done >= 10 and len(rows) == 2 * done, (done, len(rows))


def test_a_bench_without_a_launcher_says_it_runs_one_rank():
    clean = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")}
    result = subprocess.run([sys.executable, "-m", "bench", *QUICK], cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT_S, env={**clean, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.count("# note: running 1 rank: no MPI launcher") == 1
    assert "# note:" not in bench(1).stdout


def test_model_fits_checks_and_predicts_every_algorithm_on_the_first_2_and_3_ranks():
    """Issue 16: every algorithm of every collective timed on k = 2..n ranks, measured against
    predicted with the error, results exact, then predictions to 4096 ranks and the crossovers."""
    result = bench(3, "--model", "--max-bytes", "256K", "--hosts", "512x8", "--link", "1.25GB/s,20us")
    out = result.stdout
    assert result.returncode == 0, out[-3000:]
    assert "# fitted on this machine" in out and "# #wrong: 0 (every result exact)" in out, out[-3000:]
    for n in (2, 3):
        for op, algorithms in cost.ALGORITHMS.items():
            for algorithm in algorithms:
                assert re.search(rf"^ +{n} +{op} +{algorithm} +\w+ \|.*% \|", out, re.M), (n, op, algorithm)
        assert re.search(rf"^# n={n}: median \|error\| \d+%", out, re.M)
    assert re.search(r"^ +4096 +128M \|.*\| (two-level|halving|ring|doubling)$", out, re.M), out[-3000:]
    # The crossovers at 4096 ranks: every size from 8 B on goes to some algorithm of the all-reduce.
    # Which one wins where depends on the costs fitted on this machine (noisy: 5 timed iterations), so
    # only the shape is asserted; tests/test_cost.py checks that a fit recovers known costs.
    crossovers = re.search(r"^  n=4096 +(.*)$", out, re.M)
    assert crossovers, out[-1500:]
    ranges = re.findall(r"([\w-]+) (\d+[KMG]?)-", crossovers.group(1))
    assert ranges and ranges[0][1] == "8", crossovers.group(0)
    assert {name for name, _ in ranges} <= set(cost.ALGORITHMS["allreduce"]) | {"two-level"}, crossovers.group(0)


def test_each_implementation_is_timed_in_a_pass_of_its_own():
    """No implementation's calls run between another's (interleaved, gloo's made ours 4-6x slower
    at small sizes: bench/results/columns-apart-n2.txt); every call is checked, warm-up included."""
    import numpy as np
    from mpi4py import MPI

    from bench.timing import time_each

    class Comm:   # one rank: the barrier and the reductions of the timings are all-reduces of one
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 1

        def Allreduce(self, send, recv, op=None):
            if send is not MPI.IN_PLACE:
                recv[...] = send

    class Case:
        on_device, sentinel = False, -1

        def __init__(self):
            self.calls = []

        def reset(self, impl):
            pass

        def run(self, impl):
            self.calls.append(impl)
            return np.zeros(1)

        def wrong(self, result):
            return 0

    case = Case()
    timings = time_each(Comm(), case, ["ring", "mpi", "gloo"], iters=5, warmup=2)
    assert case.calls == ["ring"] * 7 + ["mpi"] * 7 + ["gloo"] * 7
    assert set(timings) == {"ring", "mpi", "gloo"} and all(t.wrong == 0 for t in timings.values())
