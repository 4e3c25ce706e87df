"""Tier 1 (but three worlds of 2, marked tier2): how the tests of a real world become one outcome each
(tests/world_outcomes.py). A test fails if it failed on any rank, naming the ranks; a rank that
died or ran out of time fails every test it never finished, saying how the world ended; and the
whole path (each rank's record, the merge, the reports) is checked end to end on planted tests."""
import re
import subprocess
import sys

import pytest

from tests.world_outcomes import RankLog, World, merge
from tests.worlds import ROOT

ENDED = "the world ended with exit status 9"


def ran(*records, collected=None, started=()):
    """A rank's log from (nodeid, outcome, message) triples; it collected them all unless told."""
    ended = {nodeid: {"nodeid": nodeid, "outcome": outcome, "message": message, "crash": message,
                      "location": ["tests/mpi/test_x.py", 3, nodeid]} for nodeid, outcome, message in records}
    return RankLog(list(ended) if collected is None else collected, set(started) | set(ended), ended)


def by_id(outcomes):
    return {o.nodeid: o for o in outcomes}


@pytest.mark.quick
def test_a_test_that_fails_on_one_rank_fails_naming_that_rank_and_its_message():
    logs = {0: ran(("a", "passed", ""), ("b", "passed", "")),
            1: ran(("a", "failed", "AssertionError: wrong sum"), ("b", "passed", "")),
            2: ran(("a", "passed", ""), ("b", "passed", ""))}
    outcomes = by_id(merge(logs, ENDED, ""))
    assert outcomes["a"].outcome == "failed" and outcomes["b"].outcome == "passed"
    assert outcomes["a"].message == "failed on rank 1:\nAssertionError: wrong sum"
    assert outcomes["a"].crash == "rank 1: AssertionError: wrong sum"


@pytest.mark.quick
def test_one_message_from_several_ranks_is_shown_once_with_all_of_them():
    logs = {r: ran(("a", "failed", "differs (failed on ranks [0, 2])" if r != 1 else "other")) for r in range(3)}
    outcome = merge(logs, ENDED, "")[0]
    assert outcome.message == "failed on ranks 0, 2:\ndiffers (failed on ranks [0, 2])\n\nfailed on rank 1:\nother"


@pytest.mark.quick
def test_a_rank_that_dies_fails_the_test_it_was_in_and_every_test_after_it():
    logs = {0: ran(("a", "passed", ""), ("b", "passed", ""), ("c", "passed", "")),
            1: ran(("a", "passed", ""), collected=["a", "b", "c"], started=["b"])}
    outcomes = by_id(merge(logs, ENDED, "the last words"))
    assert outcomes["a"].outcome == "passed" and not outcomes["a"].unreported
    assert outcomes["b"].outcome == "failed" and outcomes["b"].unreported == (1,)
    assert outcomes["b"].message == f"rank 1 started this test and never finished it: {ENDED}\n\n" \
                                    "the tail of the world's output:\nthe last words"
    assert outcomes["c"].message == f"rank 1 never reached this test: {ENDED}"
    world = World(2, 9, "the last words", list(outcomes.values()), ENDED)
    assert world.problem.startswith(f"world of 2: {ENDED}: 2 test(s) not reported by every rank")


@pytest.mark.quick
def test_a_rank_that_reported_nothing_fails_every_test():
    logs = {0: ran(("a", "passed", "")), 1: RankLog()}
    outcome = merge(logs, ENDED, "")[0]
    assert outcome.outcome == "failed" and outcome.unreported == (1,)
    assert outcome.message == f"rank 1 reported nothing (it ended before it had collected its tests): {ENDED}"


@pytest.mark.quick
def test_ranks_that_run_a_test_differently_fail_it():
    logs = {0: ran(("a", "passed", "")), 1: ran(("a", "skipped", "no GPU"))}
    outcome = merge(logs, ENDED, "")[0]
    assert outcome.outcome == "failed" and outcome.message == \
        "the ranks did not run this test alike: passed on rank 0; skipped on rank 1"


@pytest.mark.quick
def test_a_test_skipped_on_every_rank_is_skipped_with_its_reason():
    logs = {r: ran(("a", "skipped", "needs 2 ranks")) for r in range(2)}
    outcome = merge(logs, ENDED, "")[0]
    assert (outcome.outcome, outcome.message) == ("skipped", "needs 2 ranks")


@pytest.mark.parametrize("status, outcomes, problem", [
    (0, [("a", "passed")], None),
    (1, [("a", "failed")], None),
    (1, [("a", "passed")], "pytest failed, but every test passed"),
    (5, [], "not the end of a pytest run"),
    (-9, [("a", "passed")], "not the end of a pytest run"),   # (every test ended, then the world hung)
])
@pytest.mark.quick
def test_the_world_itself_fails_unless_it_ended_as_a_pytest_run_ends(status, outcomes, problem):
    logs = {0: ran(*[(nodeid, outcome, "") for nodeid, outcome in outcomes])}
    world = World(1, status, "", merge(logs, ENDED, ""), ENDED)
    assert (world.problem is None) if problem is None else problem in world.problem


def planted(worlds: str, *options: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Run the planted worlds named by ``worlds`` (a -k expression) in a pytest of their own: its
    output, and its short summary as {test id: PASSED or FAILED}."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *options, "-k", worlds,
                             "tests/programs/planted_worlds.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    return result, {nodeid: word for word, nodeid in re.findall(r"^(PASSED|FAILED) (\S+)", result.stdout, re.M)}


OUTER, INNER = "tests/programs/planted_worlds.py::", "::tests/programs/planted_world_tests.py::"


@pytest.mark.quick
@pytest.mark.tier2
@pytest.mark.parametrize("streams", [[], ["-n", "2"]], ids=["one-stream", "two-streams"])
def test_each_planted_test_of_two_worlds_is_reported_on_its_own(streams):
    """A world with a failure on rank 1, a skip and passes; a world where rank 1 dies inside a test.
    In two streams (pytest-xdist) the worlds run in the workers and their tests are reported by the
    controller."""
    result, summary = planted("failure_on_one_rank or rank_dies", *streams)
    failing, dying = f"{OUTER}test_a_world_with_a_failure_on_one_rank", f"{OUTER}test_a_world_where_a_rank_dies"
    assert summary == {
        failing: "PASSED", f"{failing}{INNER}test_passes_on_every_rank": "PASSED",
        f"{failing}{INNER}test_fails_on_rank_1_only": "FAILED", f"{failing}{INNER}test_runs_last": "PASSED",
        dying: "FAILED", f"{dying}{INNER}test_passes_on_every_rank": "PASSED",
        f"{dying}{INNER}test_fails_on_rank_1_only": "FAILED", f"{dying}{INNER}test_rank_1_dies_here": "FAILED",
        f"{dying}{INNER}test_rank_1_hangs_here": "FAILED", f"{dying}{INNER}test_runs_last": "FAILED"}, result.stdout
    skips = re.findall(r"^SKIPPED \[(\d)\] tests/programs/planted_world_tests\.py:\d+: (.*)$", result.stdout, re.M)
    assert sorted(skips) == [("1", "only in the world where a rank dies"), ("1", "only in the world where a rank hangs"),
                             ("2", "planted skip")], result.stdout
    assert "failed on rank 1:\n" in result.stdout and "AssertionError: planted failure on rank 1" in result.stdout
    for said in ("ranks 0, 1 started this test and never finished it", "ranks 0, 1 never reached this test"):
        assert re.search(f"{said}: the world ended with exit status [1-9]", result.stdout), result.stdout
    assert result.returncode == 1 and "6 failed, 4 passed, 4 skipped" in result.stdout, result.stdout


# (not quick: it waits for the world's time bound)
@pytest.mark.tier2
def test_a_world_killed_at_its_bound_fails_the_test_it_hung_in_and_every_test_after():
    result, summary = planted("rank_hangs")
    hanging = f"{OUTER}test_a_world_where_a_rank_hangs"
    assert summary[hanging] == "FAILED" and summary[f"{hanging}{INNER}test_rank_1_hangs_here"] == "FAILED"
    assert summary[f"{hanging}{INNER}test_runs_last"] == "FAILED", result.stdout
    assert "world of 2: the world was killed at its time bound (10 s): 2 test(s) not reported" in result.stdout
    assert "ranks 0, 1 started this test and never finished it: the world was killed at its time bound" in result.stdout
