"""Tier 2: torch.distributed on the "ring" backend across a change of the world
(``collectives.elastic``): DDP's survivors of a SIGKILL finish with the parameters a restart
from the last commit gives, bit for bit (``tests/programs/torch_elastic.py``); every call on a
process group of the world before raises ``MembershipChanged`` through torch, and the process
group made again, however it is asked for, is the new world's (``tests/programs/torch_rejoin.py``)."""
import re

import pytest

from tests.worlds import keep_survivors, run_world

pytest.importorskip("torch")
BOUND_S = 120
STEPS, KILLED_AT = 30, 10


def survivors(args: list[str], n: int = 4) -> tuple[str, str]:
    """Run ``python -m tests.programs.ARGS`` on n ranks, the survivors kept; all its output, and it again
    with each rank's line (``rank R...``, and a supervisor's ``[rank R] ...``) on a line of its own (the lines of
    two processes may run together)."""
    result = run_world(n, ["-m", "tests.programs." + args[0], *args[1:]], BOUND_S, launcher_args=keep_survivors())
    assert "Segmentation" not in result.stdout and "TIMED OUT" not in result.stdout, result.stdout
    return result.stdout, re.sub(r"(?<!\n)(?=rank \d(?: of \d)?: |\[rank \d\] )", "\n", result.stdout)


def digests(lines: str) -> dict[int, tuple[int, int, str]]:
    """Each rank's ``rank R of N: step S params DIGEST``, as {R: (N, S, DIGEST)}."""
    found = re.findall(r"^rank (\d) of (\d): step (\d+) params (\w+)$", lines, re.M)
    return {int(r): (int(n), int(s), d) for r, n, s, d in found}


def test_ddp_survivors_finish_as_a_restart_from_the_last_commit_would(tmp_path):
    output, lines = survivors(["torch_elastic", str(STEPS), "--kill", f"3:{KILLED_AT}"])
    assert f"elastic: rank 3 gone: 4 -> 3 ranks; back to step {KILLED_AT}" in output, output
    elastic = digests(lines)
    assert sorted(elastic) == [0, 1, 2] and len(set(elastic.values())) == 1, output

    commit = tmp_path / "commit.npz"
    _, before = survivors(["torch_elastic", str(KILLED_AT), "--save", str(commit)])
    assert set(digests(before)) == {0, 1, 2, 3} and commit.exists(), before
    _, after = survivors(["torch_elastic", str(STEPS), "--load", str(commit)], n=3)
    reference = digests(after)
    assert sorted(reference) == [0, 1, 2], after
    assert elastic[0] == reference[0] == (3, STEPS, reference[0][2]), (output, after)


@pytest.mark.parametrize("how", ["default", "explicit", "url"])
def test_the_old_process_groups_raise_and_the_one_made_again_is_the_new_worlds(how):
    output, lines = survivors(["torch_rejoin", how])
    found = {(int(r), check): outcome for r, check, outcome in re.findall(r"^rank (\d): (\w+) (.*)$", lines, re.M)}
    assert {r for r, _ in found} == {0, 1, 2}, output
    for r in range(3):
        for check in ("in_flight", "old_sync", "old_group", "old_async"):
            outcome = found.get((r, check), "")
            assert outcome.startswith("raised RingMembershipChanged: ") and "rank 3 gone: 4 -> 3 ranks" in outcome, \
                (r, check, output)
        assert found[(r, "new")] == f"returned [{r}, 3, [6.0, 6.0]]", output
