"""The README's own examples, run as a reader would run them."""
from tests.worlds import ROOT, run_world


def run_example(heading: str, n: int, directory):
    """Run the first Python block under the README's ``heading`` on n ranks, as a reader would."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split(f"{heading}\n\n```python\n", 1)[1].split("```", 1)[0]
    script = directory / "example.py"
    script.write_text(example)
    result = run_world(n, [str(script)], 120)
    assert result.returncode == 0, result.stdout
    return result


def test_the_use_example_runs_and_shows_its_results(tmp_path):
    result = run_example("## Use", 3, tmp_path)
    # x = arange(8) * (rank + 1); its average is arange(8) * 2, whose sum over 3 ranks, split 3, 3, 2, is
    # the blocks below ("print" may splice two ranks' lines, so each report is found wherever it is)
    blocks = {0: "[ 0.  6. 12.]", 1: "[18. 24. 30.]", 2: "[36. 42.]"}
    for rank, block in blocks.items():
        report = (f"rank {rank} of 3 (local {rank} of 3 on its host): sum [ 0.  6. 12.]..., my block {block}, "
                  "gathered (6, 4)")
        assert result.stdout.count(report) == 1, result.stdout


def test_the_overlap_example_runs_and_shows_its_results(tmp_path):
    result = run_example("## Overlap: nonblocking calls, fused all-reduce, a timeline", 2, tmp_path)
    for rank in (0, 1):   # 1 + 2 = 3; the average of arange(3) * 1 and * 2 is arange(3) * 1.5
        assert result.stdout.count(f"rank {rank}: grads[0] 3.0, b [0.  1.5 3. ]") == 1, result.stdout


def test_the_groups_example_runs_and_shows_its_results(tmp_path):
    result = run_example("## Groups: collectives on subsets of the ranks", 4, tmp_path)
    # x = rank + 1: rows [0, 1] sum 3, [2, 3] sum 7; columns [0, 2] sum 4, [1, 3] sum 6; rank 0 takes rank 2's 3.0
    expected = {0: "row (0, 1) sum 3.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                1: "row (0, 1) sum 3.0, column (1, 3) sum 6.0, x[0] 2.0, my rank in the row 1 of 2",
                2: "row (2, 3) sum 7.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                3: "row (2, 3) sum 7.0, column (1, 3) sum 6.0, x[0] 4.0, my rank in the row 1 of 2"}
    for rank, line in expected.items():
        assert result.stdout.count(f"rank {rank}: {line}") == 1, result.stdout


def test_the_rooted_and_personalized_example_runs_and_shows_its_results(tmp_path):
    result = run_example("## To one rank, from one rank, to each rank: reduce, gather, scatter, alltoall; bfloat16", 3,
                         tmp_path)
    # x = arange(6) + 10 r; rank r receives block r of every x; rank 0 gets r + 1 rows of value r from each r
    expected = {0: "total [30. 33.], gathered None, scattered [0 1 2 3], swapped [ 0.  1. 10. 11. 20. 21.], "
                   "uneven [0 1 1 2 2 2]",
                1: "total None, gathered None, scattered [4 5 6 7], swapped [ 2.  3. 12. 13. 22. 23.], uneven [0 1 2]",
                2: "total None, gathered 6, scattered [ 8  9 10 11], swapped [ 4.  5. 14. 15. 24. 25.], "
                   "uneven [0 1 2]"}
    for rank, line in expected.items():
        assert result.stdout.count(f"rank {rank}: {line}") == 1, result.stdout


def test_the_pytorch_example_trains_identical_replicas(tmp_path):
    import re

    import pytest
    pytest.importorskip("torch")
    result = run_example("## PyTorch: the `ring` backend", 2, tmp_path)
    sums = re.findall(r"rank \d: parameters sum (-?[\d.]+)", result.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], result.stdout
