"""Tier 2: every failure the runtime names reaches torch.distributed callers of the "ring" backend
(``tests/programs/torch_faults.py`` under mpiexec): a refusal raises the same error on every rank,
a peer that exits, dies or is late ends every survivor's call (synchronous or inside DDP's
backward) with the runtime's message naming rank 1, never a segfault and never the input
returned as if reduced; what gloo accepts (bool reductions, a non-contiguous tensor on one rank)
gives gloo's result."""
import os
import re
import subprocess
import sys

import pytest

from tests.support.faults import DEADLINE_SLACK_S, LEAVE_BOUND_S
from tests.worlds import ROOT, keep_survivors, mpiexec, run_world


pytest.importorskip("torch")
BOUND_S = 120
TIMEOUT_S = 4   # the runtime's timeout in these programs (torch's timeout= is the same)
LONG_TIMEOUT_S = 60   # ... where a peer's end is to be heard by message: an error naming it cannot be the timeout
KILL_ATTEMPTS = 4   # MPICH's launcher sometimes SIGKILLs survivors too (see tests/test_edges.py)


def scenario(n: int, name: str, cleanup: bool = True, timeout: float = TIMEOUT_S) -> tuple[int, dict[int, str], str]:
    """Run it; the exit status, each rank's one line (what follows ``rank R: ``), all the output."""
    launcher = () if cleanup else keep_survivors()
    result = run_world(n, ["-m", "tests.programs.torch_faults", name], BOUND_S,
                       env={"COLLECTIVES_TIMEOUT": str(timeout)}, launcher_args=launcher)
    assert "Segmentation" not in result.stdout and result.returncode not in (-11, 139, -9), result.stdout
    return result.returncode, _lines(result.stdout), result.stdout


def _lines(output: str) -> dict[int, str]:
    start = r"rank \d: (?=ok |\w+Error after )"   # (lines of two ranks may run together)
    found = re.findall(rf"rank (\d): (?=ok |\w+Error after )(.*?)(?={start}|\n|$)", output)
    return {int(r): line for r, line in found}


def _named(output: str, name: str) -> dict[int, str]:
    """Each rank's line of scenario ``name`` in a world that runs several in turn: what follows
    ``rank R: NAME: ``."""
    start = r"rank \d: (?:\w+: (?:\w+Error after |ok )|ok )"   # (lines of two ranks may run together)
    return {int(r): line for r, line in re.findall(rf"rank (\d): {name}: (.*?)(?={start}|\n|$)", output)}


def killed_scenario(tmp_path) -> tuple[dict[int, str], str]:
    """``killed`` at n=3, the survivors kept by the launcher (keep_survivors), each rank's output in a file of its own (the
    launcher drops what survivors print once it has seen a death)."""
    command = [*mpiexec(), *keep_survivors(), "-n", "3", str(ROOT / "tests" / "programs" / "own_output.sh"),
               sys.executable, "-m", "tests.programs.torch_faults", "killed"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLLECTIVES_TIMEOUT": str(LONG_TIMEOUT_S),
           "OWN_OUTPUT": str(tmp_path / "out")}
    subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=BOUND_S)
    output = "\n".join((tmp_path / f"out.{r}").read_text() for r in (0, 2) if (tmp_path / f"out.{r}").exists())
    return _lines(output), output


REFUSALS = {
    "count_differs": r"allreduce: x: count differs across ranks: rank 0: 3, rank 1: 4, rank 2: 5",
    "gather_uneven": r"allgather: x: trailing shape differs across ranks: rank 0: \(2,\), rank 1: \(3,\)",
    "scatter_short": r"scatter: out: count differs across ranks: rank 0: 3, rank 1: 2",
    "reduce_scatter_list": r"reduce_scatter: x: count differs across ranks: rank 0: 6, rank 1: 9",   # (padded)
    "splits_wrong": r"alltoall: out_splits: must be the rows each rank sends this one, but rank 0 expects 1 from "
                    r"rank 0, which sends 2",
    "gather_list_wrong": r"gather: gather_list: tensor 1 has 3 elements .*expected 2",
    "sparse_max": r"all_reduce: op: a sparse tensor is reduced by SUM only",
}


@pytest.fixture(scope="module")
def refusals_world() -> tuple[int, str]:
    """Every refusal in turn in one world of 3 (a refusal leaves the world in step: one launch, not seven)."""
    result = run_world(3, ["-m", "tests.programs.torch_faults", "refusals"], BOUND_S,
                       env={"COLLECTIVES_TIMEOUT": str(TIMEOUT_S)})
    return result.returncode, result.stdout


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_refusal_raises_the_same_error_on_every_rank(name, refusals_world):
    status, output = refusals_world
    lines = _named(output, name)
    assert sorted(lines) == [0, 1, 2], output
    for rank, line in lines.items():   # (a refusal, not a timeout: its type says so; the time, that it came at once)
        took = re.match(r"RingUsageError after ([\d.]+) s", line)
        assert took and float(took.group(1)) < LEAVE_BOUND_S and re.search(REFUSALS[name], line), (rank, output)
    messages = {re.sub(r" \(on rank \d; this call was abandoned on every rank\)", "", line.split(": ", 1)[1])
                for line in lines.values()}
    assert len(messages) == 1, output


def test_after_every_refusal_the_world_still_reduces_right(refusals_world):
    status, output = refusals_world
    assert status == 0 and output.count("ok after the refusals [3.0, 3.0]") == 3, output
    assert set(re.findall(r"rank 0: (\w+): ", output)) == set(REFUSALS), output   # (the program runs each of these)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n={n}")
def accepted_world(request) -> tuple[int, int, str]:
    """What gloo accepts, each in turn in one world of n (nothing fails there: one launch, not two)."""
    result = run_world(request.param, ["-m", "tests.programs.torch_faults", "accepted"], BOUND_S,
                       env={"COLLECTIVES_TIMEOUT": str(TIMEOUT_S)})
    return request.param, result.returncode, result.stdout


def test_bool_reductions_give_glooss_any_and_all(accepted_world):
    n, status, output = accepted_world
    assert status == 0 and _named(output, "bool") == {r: "ok [[True], [False]]" for r in range(n)}, output


def test_a_non_contiguous_tensor_on_one_rank_is_reduced_like_the_others(accepted_world):
    n, status, output = accepted_world
    total = sum(range(1, n + 1))
    expected = [[float(i + 3 * j) * total for j in range(2)] for i in range(3)]
    assert status == 0 and _named(output, "noncontiguous") == {r: f"ok {expected}" for r in range(n)}, output


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name, why", [
    ("exits", r"rank 1 ended its program"),
    ("late", rf"timed out after ({TIMEOUT_S}(\.\d+)?|{TIMEOUT_S - 1}\.9\d) s waiting for rank")])
def test_a_peer_that_exits_or_is_late_fails_every_survivors_call(n, name, why):
    """A peer that exits is heard by message (the timeout is long: an error naming it came by its
    farewell); a late one, at the timeout (the time is the promise there), the late rank coming
    only once every survivor's call has ended. (The message gives the time its wait waited, which
    began a few milliseconds into the call: 3.99 s, seen beside a CPU hog, for the 4 s timeout.)"""
    status, lines, output = scenario(n, name, timeout=LONG_TIMEOUT_S if name == "exits" else TIMEOUT_S)
    survivors = [r for r in range(n) if r != 1]
    assert status != 0, output
    for rank in survivors:
        seconds = float(re.match(r"RingBackendError after ([\d.]+) s", lines[rank]).group(1))
        assert re.search(rf"allreduce #1 on rank {rank}: .*{why}", lines[rank]), output
        if name == "exits":
            assert seconds < LEAVE_BOUND_S, output
        else:
            assert TIMEOUT_S <= seconds < TIMEOUT_S + DEADLINE_SLACK_S, output
    assert "ok" not in output.replace("ok[", ""), output


def test_a_killed_peer_fails_every_survivors_call_naming_it(tmp_path):
    for attempt in range(KILL_ATTEMPTS):   # (a run where the launcher killed a survivor too says nothing)
        (tmp_path / str(attempt)).mkdir()
        lines, output = killed_scenario(tmp_path / str(attempt))
        if sorted(lines) == [0, 2]:
            break
    assert sorted(lines) == [0, 2], output
    for rank in (0, 2):   # (the timeout is long: an error naming the death came by the death)
        found = re.search(rf"RingBackendError after ([\d.]+) s: allreduce #1 on rank {rank}: rank 1 is gone",
                          lines[rank])
        assert found and float(found.group(1)) < LEAVE_BOUND_S, output


# Under the launcher's cleanup and without it (keep_survivors) where a rank's end can make the launcher
# kill the survivors before they speak; a late rank or one that ends with status 0 cannot.
@pytest.mark.parametrize("name, cleanup", [("ddp_exits", True), ("ddp_exits", False), ("ddp_raises", True),
                                           ("ddp_raises", False), ("ddp_uneven", True), ("ddp_late", True)])
def test_ddp_raises_in_backward_naming_the_peer_instead_of_crashing(name, cleanup):
    status, lines, output = scenario(3, name, cleanup)
    assert status != 0, output
    why = "timed out after" if name == "ddp_late" else "rank 1 ended its program"
    for rank in (0, 2):
        assert re.search(rf"RuntimeError after [\d.]+ s: .*RingBackendError: allreduce #\d+ on rank {rank}: .*{why}",
                         lines[rank]), output
    if name == "ddp_uneven":
        assert lines[1] == "ok 3 steps", output
