"""Tier 2, issue 38: elastic jobs. A rank (or two, or the chief) SIGKILLed while the world trains; the
survivors go on in-process from the last commit and end with exactly the bits of a restart:
the same job run to that commit, saved, then resumed on the survivors' number of ranks.
Every run is bounded (``run_world``), under ``mpiexec -disable-auto-cleanup`` (MPICH) or a
recoverable job (Open MPI: ``.ci/run`` runs the first test there too)."""
import re

import pytest

from tests.support.trainer import CLEANUP, ends_as_a_restart, trainer_killing
from tests.worlds import mpi_name, run_world


JOB = ["-m", "tests.programs.elastic_job", "--steps", "80"]


def _final(output: str) -> str:
    found = re.search(r"final ([0-9a-f]{16}) at step (\d+) on (\d+) ranks", output)
    assert found, output[-3000:]
    return found.group(1)


def _restart(tmp_path, n: int, survivors: int, step: int) -> str:
    """The reference: ``n`` ranks to ``step``, saved; then ``survivors`` ranks from that file."""
    saved = tmp_path / f"at{step}.npz"
    first = run_world(n, [*JOB, "--save-at", str(step), str(saved)], 120)
    assert first.returncode == 0, first.stdout[-3000:]
    second = run_world(survivors, [*JOB, "--load", str(saved)], 120)
    assert second.returncode == 0, second.stdout[-3000:]
    return _final(second.stdout)


@pytest.mark.parametrize("n, kills, gone, step", [
    (4, ["3@30"], "rank 3 gone: 4 -> 3 ranks", 30),
    (3, ["0@20"], "rank 0 gone: 3 -> 2 ranks", 20),            # the chief: the lowest survivor takes over
    (4, ["1@25", "2@25"], "ranks 1, 2 gone: 4 -> 2 ranks", 25),   # two at once
    (5, ["4@10"], "rank 4 gone: 5 -> 4 ranks", 10),
], ids=["rank3-of-4", "chief-of-3", "two-of-4", "rank4-of-5"])
def test_the_survivors_go_on_and_end_with_the_bits_of_a_restart(tmp_path, n, kills, gone, step):
    args = [arg for kill in kills for arg in ("--kill", kill)]
    result = run_world(n, [*JOB, *args, "--stale"], 120, launcher_args=CLEANUP)
    out = result.stdout
    # A job that recovered and finished exits 0: under MPICH the killed rank's supervisor reports the
    # survivors' word, not its rank's 137; Open MPI's recoverable job reports the survivors' status.
    assert result.returncode == 0, out[-3000:]
    if mpi_name() == "MPICH":
        assert out.count("the job finished without this rank (it died of signal 9): its status is 0") == len(kills), \
            out[-3000:]
    assert out.count("elastic: ") == 1 and f"elastic: {gone}; back to step {step}" in out, out[-3000:]
    survivors = n - len(kills)
    assert out.count("stale group: MembershipChanged: allreduce: this group belongs to the world before it "
                     "changed") == survivors, out[-3000:]
    assert out.count("stale work: MembershipChanged: wait: this allreduce was in flight when the world "
                     "changed") == survivors, out[-3000:]
    assert "Traceback" not in out and "error" not in out, out[-3000:]
    assert _final(out) == _restart(tmp_path, n, survivors, step)


@pytest.mark.parametrize("victim", [0])
def test_a_death_after_the_work_ended_does_not_hang_the_survivors(victim):
    """The work is done (``final`` printed), then a rank dies: the survivors, at exit, must not wait
    for it (they waited for ever: it had said farewell as a rank that would finalize, then died)."""
    result = run_world(4, [*JOB, "--kill-at-exit", str(victim)], 60, launcher_args=CLEANUP)
    out = result.stdout
    assert "final " in out and "killed at exit" in out, out[-3000:]
    # the work was done: the job exits 0 (the survivors say so; the dead rank's supervisor heard it)
    assert result.returncode == (0 if mpi_name() == "MPICH" else result.returncode) != -9, out[-3000:]
    waited_for = re.findall(r"exiting with status 0 \(the elastic job finished\) without MPI_Finalize, which would "
                            r"wait for ever for rank\(s\) ([\d, ]+) ", out)   # (the victim, and any that left first)
    assert len(waited_for) == 3 and all(str(victim) in ranks.split(", ") for ranks in waited_for), out[-3000:]


@pytest.mark.skipif(mpi_name() != "MPICH", reason="the supervisor runs under MPICH's launcher only")
def test_a_death_inside_mpi_finalize_does_not_hang_the_others():
    """Rank 2 dies as it goes into MPI_Finalize, its exit barrier passed: the others, in MPI_Finalize
    or about to leave without it, would wait for ever (as after the trainer's ``done:`` line). Their
    supervisors end them 3 s after it ended; the job finished: status 0."""
    result = run_world(4, [*JOB, "--kill-in-finalize", "2"], 60, launcher_args=CLEANUP)
    out = result.stdout
    assert "final " in out and "killed in MPI_Finalize" in out, out[-3000:]
    assert result.returncode == 0, out[-3000:]


def test_a_rank_stuck_in_its_own_code_does_not_hold_the_job_for_ever():
    """Rank 1 sleeps in its own code at step 20: the others time out naming it and end their
    programs; under -disable-auto-cleanup nothing else would end rank 1, so mpiexec never returned.
    Its supervisor ends it once every other rank has ended after a failure. (The launch's bound, 90 s,
    is what fails the test if it hangs: the timeout, the others' bounded exit and the grace are 13 s.)"""
    result = run_world(3, [*JOB, "--stuck", "1@20", "--timeout", "3"], 90, launcher_args=CLEANUP)
    out = result.stdout
    assert result.returncode not in (0, -9) and "stuck at step 20" in out, out[-3000:]
    assert out.count("timed out after 3") == 2 and out.count("not answering (in no collective call, computing between two messages of this one, or gone): 1") == 2, \
        out[-3000:]
    if mpi_name() == "MPICH":   # (the supervisor's; Open MPI's launcher ends the job itself)
        assert "[rank 1] collectives: every other rank of this elastic job ended after a failure 5 s ago, and " \
               "this rank still runs (stuck in its own code?); it ends" in out, out[-3000:]


#: MPICH's launcher may fail by itself on a death that it sees while its proxies still set the job up
#: (``assert (!closed) failed``, status 255): the job ends, but before any rank could speak. Such a
#: run says nothing of the runtime, and is run again.
LAUNCHER_FAILED, LAUNCHER_ATTEMPTS = "assert (!closed) failed", 3


@pytest.mark.skipif(mpi_name() != "MPICH", reason="the supervisor runs under MPICH's launcher only")
def test_a_death_before_mpi_started_ends_the_others_waiting_inside_mpi_init():
    """Rank 1 dies before MPI starts; the others would wait inside MPI_Init for ever (plain MPICH
    does): their supervisors see it end among the proxy's processes and end them, naming it, or,
    where it ended before they first looked (beside a CPU hog), counting it missing."""
    for _ in range(LAUNCHER_ATTEMPTS):
        result = run_world(3, [*JOB, "--die-before-mpi", "1"], 60, launcher_args=CLEANUP)
        out = result.stdout
        if LAUNCHER_FAILED not in out:
            break
    assert result.returncode not in (0, -9) and "killed before MPI started" in out, out[-3000:]
    seen = r"(rank 1|a rank) of this job \(its supervisor's pid \d+, on this host\) ended before MPI started here, and " \
           r"MPI_Init would wait for it for ever"
    unseen = r"1 of the 3 processes the launcher started on this host ended before MPI started here \(before this " \
             r"supervisor could see them\), and MPI_Init would wait for them for ever"
    assert re.search(rf"collectives: ({seen}|{unseen}); it ends", out), out[-3000:]


@pytest.mark.skipif(mpi_name() != "MPICH", reason="the supervisor runs under MPICH's launcher only")
def test_a_death_before_any_supervisor_looked_is_counted_missing():
    """Rank 1 dies before the others' supervisors start (they wait for it to be gone:
    tests/programs/unseen_death.py), so none sees it end: they count fewer processes than the
    launcher started on the host and end, saying so, instead of waiting inside MPI_Init (or see the
    first of them end, and name it)."""
    result = run_world(3, ["-m", "tests.programs.unseen_death"], 60, launcher_args=CLEANUP)
    out = result.stdout
    assert result.returncode not in (0, -9) and "wrong" not in out, out[-3000:]
    assert ("collectives: 1 of the 3 processes the launcher started on this host ended before MPI started here "
            "(before this supervisor could see them), and MPI_Init would wait for them for ever; it ends") in out, out
    for rank in (0, 2):   # (the second to look may instead see the first end, and name it)
        assert re.search(rf"^\[rank {rank}\] collectives: .* MPI_Init would wait for (it|them) for ever; it ends$",
                         out, re.M), out


def test_a_launch_that_would_kill_the_survivors_is_warned_of_at_the_start():
    warning = "elastic: warning: mpiexec was started without -disable-auto-cleanup"
    plain = run_world(2, [*JOB, "--steps", "5"], 60)
    kept = run_world(2, [*JOB, "--steps", "5"], 60, launcher_args=CLEANUP)
    assert plain.returncode == 0 and kept.returncode == 0, plain.stdout[-3000:] + kept.stdout[-3000:]
    assert plain.stdout.count(warning) == (1 if mpi_name() == "MPICH" else 0), plain.stdout[-3000:]
    assert warning not in kept.stdout, kept.stdout[-3000:]


def test_two_deaths_one_after_the_other(tmp_path):
    result = run_world(4, [*JOB, "--kill", "3@20", "--kill", "1@50"], 120, launcher_args=CLEANUP)
    out = result.stdout
    assert "elastic: rank 3 gone: 4 -> 3 ranks; back to step 20" in out, out[-3000:]
    assert "elastic: rank 1 gone: 3 -> 2 ranks; back to step 50" in out, out[-3000:]
    # the reference: 4 ranks to 20, 3 from there to 50, 2 from there on
    at20, at50 = tmp_path / "at20.npz", tmp_path / "at50.npz"
    assert run_world(4, [*JOB, "--save-at", "20", str(at20)], 120).returncode == 0
    assert run_world(3, [*JOB, "--load", str(at20), "--save-at", "50", str(at50)], 120).returncode == 0
    last = run_world(2, [*JOB, "--load", str(at50)], 120)
    assert _final(out) == _final(last.stdout)


def test_a_rank_that_dies_during_the_survivors_agreement(tmp_path):
    """After rank 3's death, rank 2 dies in the survivors' agreement, its message of the first round
    heard by rank 0 alone: rank 0 ends that round and starts making a world with rank 2 in it, for
    which MPI's Comm_create_group would wait for ever (before: it did, and rank 1 timed out waiting
    for rank 0 in the next round). Rank 0 gives that up and agrees again with rank 1."""
    result = run_world(4, [*JOB, "--kill", "3@30", "--die-agreeing", "2", "--timeout", "20"], 120,
                       launcher_args=CLEANUP)
    out = result.stdout
    assert "killed at" in out and "in the agreement" in out, out[-3000:]
    assert out.count("elastic: ") == 1 and "elastic: ranks 2, 3 gone: 4 -> 2 ranks; back to step 30" in out, out[-3000:]
    assert "Traceback" not in out and "error" not in out, out[-3000:]
    assert _final(out) == _restart(tmp_path, 4, 2, 30)


def test_fewer_ranks_than_min_ranks_end_the_job_with_a_clear_error():
    result = run_world(3, [*JOB, "--kill", "2@10", "--min-ranks", "3"], 120, launcher_args=CLEANUP)
    out = result.stdout
    assert result.returncode != 0 and "final" not in out, out[-3000:]
    assert out.count("elastic: 2 rank(s) left after rank 2 gone: 3 -> 2 ranks, fewer than min_ranks=3; the job "
                     "ends") == 2, out[-3000:]


def test_an_error_of_the_program_still_ends_the_job():
    """Not a death: rank 1 raises. Its farewell names the error; nobody rebuilds anything."""
    result = run_world(3, [*JOB, "--raise", "1@10"], 120, launcher_args=CLEANUP)
    out = result.stdout
    assert result.returncode != 0 and "elastic:" not in out and "final" not in out, out[-3000:]
    assert "ValueError: the program's own error at step 10" in out, out[-3000:]
    assert re.search(r"\[rank [02]\] error: .*rank 1 (left: |gave up \(.*?\): rank 1 is ending \()uncaught ValueError",
                     out), out[-3000:]   # (its give-up may be read before its farewell)


def test_the_trainer_loses_a_rank_and_ends_with_the_bits_of_a_restart(tmp_path):
    """``python -m trainer --elastic`` at n = 4: the process of rank 2 (by the pid the trainer
    prints) is SIGKILLed during epoch 3; the line of the change names it and the step the run went
    back to, and the run ends with the parameters of 4 ranks to that step (--max-steps, a
    checkpoint) then 3 ranks resumed from it."""
    train = ["-m", "trainer", "--epochs", "6", "--dtype", "float64"]
    out, _ = trainer_killing(train, "epoch   2/", 2)
    found = re.search(r"elastic: rank 2 gone: 4 -> 3 ranks; back to step (\d+)", out)
    assert found and "done: " in out, out[-3000:]
    ends_as_a_restart(out, train, 4, int(found.group(1)), 3, tmp_path)


def test_the_trainer_killed_after_its_done_line_ends_without_hanging():
    """A death after the work ended (the ``done:`` line): the survivors, at exit, must not wait for
    the dead rank (MPI_Finalize would wait for it for ever). The victim is rank 2: rank 0's ``done:``
    comes after the last call (the parameters' digest, by recursive doubling at n=4), which rank 0
    completes only once rank 2 has sent all it sends in it; rank 3, whose last message goes to
    rank 1, may not have sent it yet, and rank 1 would then lose a peer inside its last call."""
    out, status = trainer_killing(["-m", "trainer", "--epochs", "3"], "done: ", 2, seconds=60)
    assert status == 0 and "done: " in out, out[-3000:]   # (the work was done: the job finished)
    # each survivor ends without MPI_Finalize: at its exit barrier, which finds rank 2 gone, or, where rank 2
    # died once every rank had passed it, by its supervisor once MPI_Finalize waits for the dead rank
    for rank in (0, 1, 3):
        assert re.search(rf"\[rank {rank}\] collectives: (exiting with status 0 \(the elastic job finished\) "
                         r"without MPI_Finalize, which would wait for ever for rank\(s\) |this rank's elastic job "
                         r"finished, but MPI_Finalize has not returned)", out), out[-3000:]


def test_the_trainer_grows_by_host_discovery_and_ends_with_the_bits_of_a_restart(tmp_path):
    """``python -m trainer --elastic --host-discovery`` started on 2 ranks of a host whose third
    slot the script lists from its second run on (a second or so into training): a newcomer
    starts and joins at a commit (the line names it and the step), and the run ends with the
    parameters of 2 ranks to that step (--max-steps, a checkpoint) then 3 ranks resumed from it.
    The newcomer runs the trainer's start-up without its collectives (rank 0's state is its
    start)."""
    train = ["-m", "trainer", "--epochs", "100", "--dtype", "float64"]
    runs = tmp_path / "runs"
    script = f"echo run >> {runs}; [ $(wc -l < {runs}) -ge 2 ] && echo localhost:3 || echo localhost:2"
    elastic = ["--elastic", "--max-ranks", "3", "--host-discovery", script]
    grown = run_world(2, [*train, *elastic], 120, launcher_args=CLEANUP)
    out = grown.stdout
    found = re.search(r"elastic: 1 joined: 2 -> 3 ranks; back to step (\d+)", out)
    assert grown.returncode == 0 and found and "done: 100 epoch(s)" in out and "on 3 rank(s)" in out, out[-3000:]
    assert 0 < int(found.group(1)) < 100 * 23, out[-3000:]   # (23 steps an epoch: 1438 digits, batches of 64)
    ends_as_a_restart(out, train, 2, int(found.group(1)), 3, tmp_path)
