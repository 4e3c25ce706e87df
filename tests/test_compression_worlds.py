"""Tier 2 for ``compression=`` beyond tests/test_worlds.py (which runs tests/mpi/test_compression.py
among all of tests/mpi in real worlds of 1 to 4 ranks): the same file at 4 ranks on 2 declared hosts
(the two-level all-reduce, compressed across them), and the bench's compressed column."""
import pytest

from tests.support.bench import bench, rows_of


PATHS = ["tests/mpi/test_compression.py"]


def test_compression_across_two_declared_hosts(world_tests):
    world_tests(4, PATHS, env={"COLLECTIVES_HOSTS": "2"})


def test_the_bench_times_a_compressed_column_in_a_pass_of_its_own(tmp_path):
    """``--impl ring ring-bf16``: a column of ours with compression="bf16" (exact on the bench's
    small integers), and its busbw over the plain ring's."""
    result = bench(2, "--impl", "ring", "ring-bf16", "--min-bytes", "512K", "--max-bytes", "1M", "--factor", "2",
                   "--json", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "ring-bf16: time" in result.stdout and "bf16/ring" in result.stdout, result.stdout[-4000:]
    _, rows = rows_of(tmp_path / "b.json")
    assert [(r["impl"], r["wrong"]) for r in rows] == [("ring", 0), ("ring-bf16", 0)] * 2, rows


@pytest.mark.parametrize("flags", [["--op", "allgather"], ["--dtype", "int32"], ["--redop", "max"]])
def test_the_bench_refuses_a_compressed_column_where_compression_cannot_run(flags):
    result = bench(2, "--impl", "ring-bf16", *flags, timeout=60)
    assert result.returncode == 2, result.stdout[-2000:]
    assert result.stdout.count("--impl ring-bf16: compression= is the host all-reduce's") == 1, result.stdout[-2000:]
