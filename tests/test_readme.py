"""The README's own examples, run as a reader would run them."""
from tests.worlds import ROOT, run_world


def test_the_use_example_runs_and_shows_its_results(tmp_path):
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Use\n\n```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "my_script.py"
    script.write_text(example)
    result = run_world(3, [str(script)], 120)
    assert result.returncode == 0, result.stdout
    # x = arange(8) * (rank + 1); its average is arange(8) * 2, whose sum over 3 ranks, split 3, 3, 2, is
    # the blocks below ("print" may splice two ranks' lines, so each report is found wherever it is)
    blocks = {0: "[ 0.  6. 12.]", 1: "[18. 24. 30.]", 2: "[36. 42.]"}
    for rank, block in blocks.items():
        report = (f"rank {rank} of 3 (local {rank} of 3 on its host): sum [ 0.  6. 12.]..., my block {block}, "
                  "gathered (6, 4)")
        assert result.stdout.count(report) == 1, result.stdout


def test_the_overlap_example_runs_and_shows_its_results(tmp_path):
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Overlap: nonblocking calls, fused all-reduce, a timeline\n\n```python\n", 1)[1]
    script = tmp_path / "overlap.py"
    script.write_text(example.split("```", 1)[0])
    result = run_world(2, [str(script)], 120)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):   # 1 + 2 = 3; the average of arange(3) * 1 and * 2 is arange(3) * 1.5
        assert result.stdout.count(f"rank {rank}: grads[0] 3.0, b [0.  1.5 3. ]") == 1, result.stdout


def test_the_groups_example_runs_and_shows_its_results(tmp_path):
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Groups: collectives on subsets of the ranks\n\n```python\n", 1)[1]
    script = tmp_path / "groups.py"
    script.write_text(example.split("```", 1)[0])
    result = run_world(4, [str(script)], 120)
    assert result.returncode == 0, result.stdout
    # x = rank + 1: rows [0, 1] sum 3, [2, 3] sum 7; columns [0, 2] sum 4, [1, 3] sum 6; rank 0 takes rank 2's 3.0
    expected = {0: "row (0, 1) sum 3.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                1: "row (0, 1) sum 3.0, column (1, 3) sum 6.0, x[0] 2.0, my rank in the row 1 of 2",
                2: "row (2, 3) sum 7.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                3: "row (2, 3) sum 7.0, column (1, 3) sum 6.0, x[0] 4.0, my rank in the row 1 of 2"}
    for rank, line in expected.items():
        assert result.stdout.count(f"rank {rank}: {line}") == 1, result.stdout
