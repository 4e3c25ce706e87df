"""Tier 2, issue 62: ``collectives.torch.reproducible_hook``, DDP's buckets averaged by the reproducible
all-reduce (``tests/programs/torch_reproducible_hook.py`` says each check). One contribution per
rank: the bits do not depend on the algorithm or the segment size (they do on the world size)."""
import re

import pytest

from tests.worlds import run_world

pytest.importorskip("torch")
BOUND_S = 120
PROGRAM = ["-m", "tests.programs.torch_reproducible_hook"]


def trained(n: int, env: dict, *flags: str) -> str:
    """The digest of the program's run, every check of it passed."""
    result = run_world(n, [*PROGRAM, *flags], BOUND_S, env={"COLLECTIVES_TIMEOUT": "60", **env})
    out = result.stdout
    verdicts = dict(re.findall(r"^CHECK (\S+): (.*)$", out, re.MULTILINE))
    expected = {"replicas", "trains", "avg"} | (set() if "--plain" in flags else {"hook"})
    assert result.returncode == 0 and set(verdicts) == expected and set(verdicts.values()) == {"ok"}, out[-3000:]
    return re.search(r"^digest (\w+)$", out, re.MULTILINE).group(1)


@pytest.mark.parametrize("n", [2, 3])
def test_the_hook_trains_to_the_same_bits_whatever_the_algorithm_and_segments(n):
    """At 3 ranks, where the plain all-reduce's order differs between the algorithms (the test
    below), and at 2, where two contributions in all take the plain all-reduce (one rounding). The reproducible all-reduce under the hook gives the same bits for every algorithm and
    size at every world size 1 to 4 in tests/mpi/test_reproducible.py (one float32 contribution per
    rank, as here): the hook adds DDP's buckets, which do not depend on the world size."""
    settings = [{"COLLECTIVES_ALGORITHM": "ring"}, {"COLLECTIVES_ALGORITHM": "doubling"},
                {"COLLECTIVES_ALGORITHM": "ring", "COLLECTIVES_SEGMENT_BYTES": "4096"}]
    digests = {trained(n, env) for env in settings}
    assert len(digests) == 1, digests


def test_without_the_hook_the_algorithm_changes_the_bits():
    """The comparison above could fail: DDP's own average adds 3 ranks' buckets in the algorithm's order."""
    assert trained(3, {"COLLECTIVES_ALGORITHM": "ring"}, "--plain") != \
        trained(3, {"COLLECTIVES_ALGORITHM": "doubling"}, "--plain")


def test_the_hook_refuses_a_process_group_of_another_backend():
    from collectives.torch.hooks import _ring_group
    import collectives as col
    with pytest.raises(col.CollectiveUsageError, match="reproducible_hook: state: expected None or a process group "
                                                       "of the ring backend"):
        _ring_group(object())
