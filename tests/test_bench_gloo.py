"""Tier 2: `python -m bench`'s gloo column: torch.distributed's gloo timed beside the ring and MPI, in one launch.

Its numbers are shown, never asserted against each other (the shared machine's speed is noise);
what is checked is that the column is there, exact, positive, and that a missing torch (or a dtype
gloo has not) leaves it out with one note instead of failing.
"""
import importlib.util
import json

import pytest

from tests.worlds import ROOT, run_world

TIMEOUT_S = 240
QUICK = ["--max-bytes", "64K", "--factor", "16", "--iters", "5", "--warmup", "1"]
SIZES = [8, 128, 2048, 32768]
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason='needs torch (pip install -e ".[torch]")')


def bench(n, *flags, env=None):
    return run_world(n, ["-m", "bench", *QUICK, *flags], TIMEOUT_S, env=env)


def table(stdout: str) -> list[list[str]]:
    """The table's lines, each cut at its ``|`` into the size's fields, one part per implementation,
    then the ratios."""
    return [line.split("|") for line in stdout.splitlines() if line.strip()[:1].isdigit()]


@needs_torch
@pytest.mark.parametrize("n,op,flags", [(2, "allreduce", []),
                                        (2, "allreduce", ["--dtype", "float16", "--redop", "avg"]),
                                        (3, "reduce_scatter", ["--dtype", "int8", "--redop", "max"]),
                                        (3, "allgather", ["--dtype", "uint8"]),
                                        (3, "broadcast", ["--dtype", "float64", "--root", "2"])])
def test_the_gloo_column_is_timed_beside_ring_and_mpi_exact_and_positive(n, op, flags, tmp_path):
    result = bench(n, "--op", op, *flags, "--json", str(tmp_path / "b.json"))
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    header = [line for line in out.splitlines() if line.startswith("#") and "count" in line][0]
    assert [part.split(":")[0].strip() for part in header.split("|")[1:]] == ["ring", "mpi", "gloo", "ring/mpi",
                                                                           "ring/gloo"], header
    assert out.count("# gloo: torch ") == 1 and "gloo column omitted" not in out
    lines = table(out)
    assert len(lines) == len(SIZES) and all(len(parts) == 6 for parts in lines), out[-3000:]
    for parts in lines:
        time_us, algbw, busbw, wrong = parts[3].split()
        assert float(time_us) > 0 and wrong == "0" and float(parts[5]) > 0, parts
    report = json.loads((tmp_path / "b.json").read_text())
    rows = report["rows"]
    assert [(r["impl"], r["op"]) for r in rows] == [(impl, op) for _ in SIZES for impl in ("ring", "mpi", "gloo")]
    gloo = [r for r in rows if r["impl"] == "gloo"]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["algbw"] > 0 and r["busbw"] > 0 for r in gloo), gloo
    assert [r["bytes"] for r in gloo] == [r["bytes"] for r in rows if r["impl"] == "ring"]
    assert report["environment"]["torch"] and report["environment"]["gloo"].startswith("gloo: torch ")


@needs_torch
def test_a_wrong_element_of_gloo_shows_in_wrong_and_in_the_exit_status(tmp_path):
    result = bench(2, "--plant-error", "gloo", "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1, result.stdout[-4000:]
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert all(r["wrong"] == (1 if r["impl"] == "gloo" else 0) for r in rows), rows


@needs_torch
@pytest.mark.parametrize("flags,column", [(["--no-gloo"], False), (["--impl", "ring", "mpi"], False),
                                          (["--impl", "ring", "--gloo"], True), (["--impl", "gloo"], True)])
def test_the_flags_choose_whether_gloo_is_timed(flags, column):
    result = bench(2, *flags)
    assert result.returncode == 0, result.stdout[-3000:]
    assert ("gloo: time" in result.stdout) == column and "# note:" not in result.stdout


def without_torch(tmp_path) -> dict:
    """An environment in which ``import torch`` fails, as where it is not installed."""
    shim = tmp_path / "shim" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    return {"PYTHONPATH": f"{shim.parent}:{ROOT}"}


def test_without_torch_the_column_is_left_out_with_one_note(tmp_path):
    result = bench(2, "--json", str(tmp_path / "b.json"), env=without_torch(tmp_path))
    out = result.stdout
    assert result.returncode == 0, out[-3000:]
    assert out.count("# note: gloo column omitted: torch is not installed") == 1, out[-3000:]
    assert 'pip install -e ".[torch]"' in out and "gloo: time" not in out and "Traceback" not in out
    assert all(len(parts) == 4 for parts in table(out)) and len(table(out)) == len(SIZES)
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert {r["impl"] for r in rows} == {"ring", "mpi"} and all(r["wrong"] == 0 for r in rows)


def test_without_torch_asking_for_gloo_is_a_usage_error(tmp_path):
    result = bench(2, "--gloo", env=without_torch(tmp_path))
    assert result.returncode == 2, result.stdout[-2000:]
    assert result.stdout.count("--gloo: torch is not installed") == 1 and "memcpy" not in result.stdout


@needs_torch
def test_a_dtype_gloo_has_not_leaves_the_column_out_with_a_note_or_is_refused_when_asked_for():
    quiet = bench(2, "--dtype", "int16")
    assert quiet.returncode == 0 and quiet.stdout.count("# note: gloo column omitted: gloo has no int16") == 1
    assert "gloo: time" not in quiet.stdout
    asked = bench(2, "--dtype", "uint32", "--gloo")
    assert asked.returncode == 2 and asked.stdout.count("--gloo: gloo has no uint32") == 1, asked.stdout[-2000:]


@pytest.mark.parametrize("flags,message", [
    (["--model", "--gloo"], "--model times the host algorithms alone: no --gloo"),
    (["--device", "cuda", "--gloo"], "--gloo times host arrays")])
def test_gloo_where_it_does_not_belong_is_a_usage_error(flags, message):
    result = bench(2, *flags)
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout[-2000:]
