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
