"""Tier 2: the front page's and the manual's (docs/) examples, run as a reader would run them; and their
links, which must all lead somewhere in a fresh clone."""
import re

import pytest

from tests.worlds import ROOT, run_world

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Every Python block of the pages, by (page, the heading it follows): each is run by a test below.
RUN = {("README.md", "## Quick start"), ("docs/api.md", "# The collective API"),
       ("docs/api.md", "## To one rank, from one rank, to each rank: reduce, gather, scatter, alltoall; bfloat16"),
       ("docs/api.md", '## Compression on the wire: `compression="bf16"` or `"fp16"`'),
       ("docs/overlap.md", "# Overlap: nonblocking calls, fused all-reduce, a timeline"),
       ("docs/groups.md", "# Groups: collectives on subsets of the ranks"),
       ("docs/pytorch.md", "# PyTorch: the `ring` backend"), ("docs/pytorch.md", "## Compression hooks"),
       ("docs/elastic.md", "## In your own program"), ("docs/api.md", "## Reproducible sums: `reproducible=True`"),
       ("docs/reproducible.md", "# Reproducible sums: `allreduce(x, reproducible=True)`")}
#: Blocks that cannot run here, and why.
NOT_RUN = {("docs/gpu.md", "# GPU arrays (CuPy over NCCL)"): "needs a GPU (tests/test_gpu.py runs its calls there)",
           ("docs/pytorch.md", "## Elastic DDP: the survivors of a death go on"):
               "an excerpt of tests/programs/torch_elastic.py, which tests/test_torch_elastic.py runs with a SIGKILL"}


def run_example(page: str, heading: str, n: int, directory):
    """Run the first Python block under ``heading`` of ``page`` on n ranks, as a reader would."""
    text = (ROOT / page).read_text()
    example = text.split(f"{heading}\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    script = directory / "example.py"
    script.write_text(example)
    result = run_world(n, [str(script)], 120)
    assert result.returncode == 0, result.stdout
    return result


def python_blocks(path) -> list[str]:
    """The heading above each Python block of a page."""
    heading, found = "", []
    for line in path.read_text().splitlines():
        if re.match(r"#{1,3} ", line):
            heading = line
        elif line.startswith("```python"):
            found.append(heading)
    return found


@pytest.mark.quick
def test_every_python_block_of_every_page_is_run_or_says_why_not():
    blocks = {(str(path.relative_to(ROOT)), heading) for path in PAGES for heading in python_blocks(path)}
    assert blocks - RUN - set(NOT_RUN) == set(), "Python blocks no test runs"
    assert RUN - blocks == set(), "tests for blocks that are gone"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


@pytest.mark.quick
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_picture_leads_somewhere(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target}: no such file"
        if fragment:
            headings = [anchor(line) for line in resolved.read_text().splitlines() if re.match(r"#{1,6} ", line)]
            assert fragment in headings, f"{page.name}: {target}: no such heading in {resolved.name}"


@pytest.mark.quick
def test_the_front_page_links_every_page_of_the_manual():
    front = (ROOT / "README.md").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"(docs/{p.name})" not in front]
    assert not missing, f"pages the front page does not link: {missing}"


@pytest.mark.quick
def test_the_quick_start_runs_and_shows_its_results(tmp_path):
    result = run_example("README.md", "## Quick start", 3, tmp_path)
    # x = arange(4) * (rank + 1): the sum over 3 ranks is arange(4) * 6; 3 ranks x 4 gathered
    for rank in range(3):
        assert result.stdout.count(f"rank {rank}: total [ 0.  6. 12. 18.], gathered 12, my group "
                                   f"{(0, 2) if rank % 2 == 0 else (1,)}") == 1, result.stdout


def test_the_use_example_runs_and_shows_its_results(tmp_path):
    result = run_example("docs/api.md", "# The collective API", 3, tmp_path)
    # x = arange(8) * (rank + 1); its average is arange(8) * 2, whose sum over 3 ranks, split 3, 3, 2, is
    # the blocks below ("print" may splice two ranks' lines, so each report is found wherever it is)
    blocks = {0: "[ 0.  6. 12.]", 1: "[18. 24. 30.]", 2: "[36. 42.]"}
    for rank, block in blocks.items():
        report = (f"rank {rank} of 3 (local {rank} of 3 on its host): sum [ 0.  6. 12.]..., my block {block}, "
                  "gathered (6, 4)")
        assert result.stdout.count(report) == 1, result.stdout


def test_the_overlap_example_runs_and_shows_its_results(tmp_path):
    result = run_example("docs/overlap.md", "# Overlap: nonblocking calls, fused all-reduce, a timeline", 2, tmp_path)
    for rank in (0, 1):   # 1 + 2 = 3; the average of arange(3) * 1 and * 2 is arange(3) * 1.5
        assert result.stdout.count(f"rank {rank}: grads[0] 3.0, b [0.  1.5 3. ]") == 1, result.stdout


def test_the_groups_example_runs_and_shows_its_results(tmp_path):
    result = run_example("docs/groups.md", "# Groups: collectives on subsets of the ranks", 4, tmp_path)
    # x = rank + 1: rows [0, 1] sum 3, [2, 3] sum 7; columns [0, 2] sum 4, [1, 3] sum 6; rank 0 takes rank 2's 3.0
    expected = {0: "row (0, 1) sum 3.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                1: "row (0, 1) sum 3.0, column (1, 3) sum 6.0, x[0] 2.0, my rank in the row 1 of 2",
                2: "row (2, 3) sum 7.0, column (0, 2) sum 4.0, x[0] 3.0, my rank in the row 0 of 2",
                3: "row (2, 3) sum 7.0, column (1, 3) sum 6.0, x[0] 4.0, my rank in the row 1 of 2"}
    for rank, line in expected.items():
        assert result.stdout.count(f"rank {rank}: {line}") == 1, result.stdout


def test_the_rooted_and_personalized_example_runs_and_shows_its_results(tmp_path):
    result = run_example("docs/api.md", "## To one rank, from one rank, to each rank: reduce, gather, scatter, "
                         "alltoall; bfloat16", 3, tmp_path)
    # x = arange(6) + 10 r; rank r receives block r of every x; rank 0 gets r + 1 rows of value r from each r
    expected = {0: "total [30. 33.], gathered None, scattered [0 1 2 3], swapped [ 0.  1. 10. 11. 20. 21.], "
                   "uneven [0 1 1 2 2 2]",
                1: "total None, gathered None, scattered [4 5 6 7], swapped [ 2.  3. 12. 13. 22. 23.], uneven [0 1 2]",
                2: "total None, gathered 6, scattered [ 8  9 10 11], swapped [ 4.  5. 14. 15. 24. 25.], "
                   "uneven [0 1 2]"}
    for rank, line in expected.items():
        assert result.stdout.count(f"rank {rank}: {line}") == 1, result.stdout


def test_the_compression_example_runs_and_every_rank_gets_the_same_bits(tmp_path):
    result = run_example("docs/api.md", '## Compression on the wire: `compression="bf16"` or `"fp16"`', 3, tmp_path)
    import re
    found = re.findall(r"rank (\d): mean\[:2\] (.*?), same as in place: True", result.stdout)
    reports = {int(r): rest for r, rest in found}
    assert sorted(reports) == [0, 1, 2] and len(set(reports.values())) == 1, result.stdout


@pytest.mark.parametrize("page, heading", [("docs/api.md", "## Reproducible sums: `reproducible=True`"),
                                           ("docs/reproducible.md", "# Reproducible sums: `allreduce(x, reproducible=True)`")])
def test_the_reproducible_examples_print_the_same_bits_at_two_and_three_ranks(page, heading, tmp_path):
    arrays = r"rank (\d+): (\[[^\]]*\](?: \[[^\]]*\])?)"   # (the ranks' lines may interleave)
    printed = [dict(re.findall(arrays, run_example(page, heading, n, tmp_path).stdout)) for n in (2, 3)]
    assert [len(p) for p in printed] == [2, 3] and len(set(printed[0].values()) | set(printed[1].values())) == 1, printed


def test_the_pytorch_example_trains_identical_replicas(tmp_path):
    import re

    import pytest
    pytest.importorskip("torch")
    result = run_example("docs/pytorch.md", "# PyTorch: the `ring` backend", 2, tmp_path)
    sums = re.findall(r"rank \d: parameters sum (-?[\d.]+)", result.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], result.stdout


def test_the_compression_hooks_example_keeps_replicas_identical(tmp_path):
    """Each hook's parameters end alike on every rank (the model differs by rank before DDP
    broadcasts it, and the data by rank every step)."""
    import re

    import pytest
    pytest.importorskip("torch")
    result = run_example("docs/pytorch.md", "## Compression hooks", 3, tmp_path)
    sums = re.findall(r"rank (\d): (\w+): parameters sum (-?[\d.]+)", result.stdout)
    assert len(sums) == 9, result.stdout
    for hook in ("fp16_compress_hook", "bf16_hook", "powerSGD_hook"):
        assert len({s for _, h, s in sums if h == hook}) == 1, result.stdout


def test_the_elastic_example_runs_as_the_page_shows(tmp_path):
    result = run_example("docs/elastic.md", "## In your own program", 3, tmp_path)
    assert "trained 200 steps on 3 ranks" in result.stdout, result.stdout


@pytest.mark.quick
def test_the_front_page_fits_its_budget_and_names_every_test_dependency():
    """150 lines at most (detail goes to docs/), and what the install line's `test` extra brings, every
    package of it (setup.py's list), so that a reader knows what `pip install -e ".[test]"` installs."""
    front = (ROOT / "README.md").read_text()
    assert len(front.splitlines()) <= 150, f"README.md: {len(front.splitlines())} lines"
    extra = re.search(r'"test": \[(.*?)\]', (ROOT / "setup.py").read_text(), re.S)[1]
    packages = [re.split(r"[<>=]", name)[0] for name in re.findall(r'"([^"]+)"', extra)]
    said = front.split("`test` brings", 1)[1].split("Smaller extras", 1)[0]
    assert [p for p in packages if p not in said] == [], said
