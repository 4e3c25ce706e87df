"""Tier 2, issue 6's and 12's fault suite, as users cause faults: absent, late, killed and departing ranks
(an uncaught exception, sys.exit, Ctrl-C, a skipped step, a crash before the first collective),
Ctrl-C inside a call, settings that differ, threads, MPI.Finalize by the program. Every world is
bounded in time, and each test asserts what every rank printed.

The ranks of a scenario wait for each other on cues (a message on MPI_COMM_WORLD, a process's
end, the main thread inside a call: tests/programs/faults.py), never on a sleep that races the
runtime. Where the time is the promise, the bounds hold on a loaded 2-core machine: a rank that
left is heard within LEAVE_BOUND_S, by message: the runtime's timeout is far longer there (600 s
unless the scenario sets one), so an error that names the rank that left and came at all came
by message; a call with timeout=T raises at T at the earliest and within DEADLINE_SLACK_S after."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

#: Two ranks that wait for the same absent one: the one whose timeout ends first tells the other it gave up,
#: and then its program ends, which it says too; the other may hear either before its own timeout ends (its
#: error then names the first's, which is a timeout too).

from ring.transport.base import ROLL_CALL_GRACE
from ring.transport.host_waits import process_state as _process_state
from tests.support.faults import (AT_ONCE_S, BOUND_S, DEADLINE_SLACK_S, LEAVE_BOUND_S, fault, reported_errors,
                                  trace_events)
from tests.worlds import ROOT, keep_survivors, mpi_name, mpiexec, run_world


HEARD_FIRST = (r"(rank \d (gave up \(its runtime stopped after \d+ collective\(s\) of this group\)"
               r"|left: it stopped after a failure): allreduce #2 on rank \d: )?")


def heard_first(message: str, rank: int) -> bool:
    """Whether rank ``rank``'s error names another rank that failed first (then it raised when it heard,
    which may be before its own timeout, if it entered the call later than that rank)."""
    return re.match(rf"\S+ #\d+ on rank {rank}( in group \[[\d, ]+\])?: rank \d+ (gave up|left)", message) is not None


def says_it_left(message: str, why: str) -> bool:
    """Whether ``message`` ends with ``why`` (``rank R left: uncaught E (after C collective(s))``), or with
    the give-up that rank R sends as its program ends, which another rank may read before its farewell:
    ``rank R gave up (its runtime stopped after C collective(s) of this group): rank R is ending (uncaught E)``."""
    if message.endswith(why):
        return True
    left = re.fullmatch(r"rank (\d+) left: (uncaught .*) \(after (\d+) collective\(s\)\)", why)
    return left is not None and message.endswith(
        f"rank {left[1]} gave up (its runtime stopped after {left[3]} collective(s) of this group): rank {left[1]} "
        f"is ending ({left[2]})")


def test_an_absent_rank_makes_the_others_time_out_naming_it():
    """At the timeout, not a roll call's grace (1 s) after it: the waits ask who is where ahead.
    The time is the promise: the check allows the whole grace for a loaded machine's delays, so
    only a wait that adds the grace fails it."""
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "absent"], BOUND_S)
    assert time.monotonic() - started < BOUND_S and result.returncode not in (0, -9), result.stdout
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: CollectiveError: allreduce #2 on rank {rank}: {HEARD_FIRST}timed out after "
                         r"2(\.\d+)? s", result.stdout), result.stdout
        seconds = float(re.search(rf"rank {rank}: raised after ([\d.]+) s", result.stdout)[1])
        assert 2 <= seconds or heard_first(re.search(rf"rank {rank}: CollectiveError: (.*)", result.stdout)[1], rank)
        assert seconds < 2 + ROLL_CALL_GRACE, result.stdout
        assert f"rank {rank}: then: allreduce: the runtime stopped after an earlier failure" in result.stdout
    assert "rank(s) not answering (in no collective call, computing between two messages of this one, or gone): 2" in result.stdout, result.stdout


@pytest.mark.parametrize("cleanup", [True, False])
def test_a_rank_stuck_in_its_own_code_does_not_hold_the_job_at_exit(cleanup):
    """The others time out (2 s), end their programs, wait at exit for it no longer than their failed
    call's own timeout (2 s, not COLLECTIVES_TIMEOUT's 4), say so, and end with status 1 without
    MPI_Finalize: the launcher ends the job then (the
    stuck rank sleeps an hour: if nothing ended it, the world's bound would). With
    -disable-auto-cleanup MPICH's launcher lets the stuck rank run on (here until the others'
    processes have ended); then its next call fails at once, naming the others, and it ends without
    waiting at exit. The exit's wait is shown by what the others say (2 s); the wall time only
    bounds it generously, far below the world's bound."""
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "stuck", "for-ever" if cleanup else "until-alone"],
                       BOUND_S, env={"COLLECTIVES_TIMEOUT": "4"}, launcher_args=() if cleanup else keep_survivors())
    wall = time.monotonic() - started
    assert result.returncode not in (0, -9), result.stdout
    if mpi_name() == "MPICH":   # (Open MPI's recoverable job ends the stuck rank once the others have ended)
        assert ("rank 2: woke" in result.stdout) != cleanup, result.stdout
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: CollectiveError: allreduce #2 on rank {rank}: {HEARD_FIRST}timed out after 2",
                         result.stdout), result.stdout
        # (every survivor names rank 2: the one that hears first that the other will not finalize names
        # both, the other rank as leaving too and rank 2 as not at exit yet)
        line = re.search(rf"\[rank {rank}\] collectives: exiting with status 1 without MPI_Finalize, which would "
                         r"wait for ever for rank\(s\) (.*)", result.stdout)
        assert line, result.stdout
        assert line[1] in ("2 (not at exit 2 s after this rank's failure, its timeout: still in its own code?)",
                           f"{1 - rank} (leaving without it too) and 2 (not at exit yet: still in its own code?)"), result.stdout
    assert "for rank(s) 2 (not at exit 2 s after this rank's failure, its timeout: still in its own code?)" \
        in result.stdout, result.stdout
    assert wall < 30, result.stdout


def test_a_healthy_rank_that_finds_one_gone_at_exit_names_the_one_still_in_its_own_code():
    """Rank 2 did nothing wrong; when it comes to its exit rank 0 has left without MPI_Finalize and
    rank 1 is still in its own code: its last line names both (before: rank 0 alone)."""
    result = run_world(3, ["-m", "tests.programs.faults", "stuck-beside-a-part"], BOUND_S,
                       launcher_args=keep_survivors())
    assert "rank 1: woke" in result.stdout, result.stdout
    assert "[rank 2] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever for rank(s) " \
           "0 (leaving without it too) and 1 (not at exit yet: still in its own code?)\n" in result.stdout, result.stdout


@pytest.mark.parametrize("absent, first", [("until-cued", "allreduce"), ("for-ever", "allreduce"),
                                           ("until-cued", "recv")])
def test_a_rank_absent_from_setup_makes_the_first_call_time_out_by_its_own_timeout(absent, first):
    """The others then end without MPI_Finalize, so that the launcher ends the job even where the
    absent rank never ends (for-ever: MPICH's launcher waited for it for ever after their finalize).
    A first call that is a receive sets up within its timeout too (it took COLLECTIVES_TIMEOUT)."""
    status, output, wall = fault(3, "absent-at-setup", absent, first)
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1] and wall < 30, output
    assert "exiting with status 1 without MPI_Finalize: a rank of this job did not come to the runtime's setup" \
        in output, output
    for seconds, message in errors.values():
        assert 2 <= seconds < 2 + DEADLINE_SLACK_S, output
        assert re.match(r"init: timed out after 2(\.\d+)? s waiting for every rank to make the runtime's communicator",
                        message), output


def test_a_retry_after_a_setup_timeout_times_out_too_and_every_rank_ends_with_status_1():
    """The runtime is set up once in a job: a rank that catches the setup's timeout and calls again
    waits for a setup the late rank never joins (the late rank's first call met the abandoned one, and
    waits a step further on), so both calls time out and the job ends with status 1."""
    status, output, wall = fault(2, "retry-at-setup")
    errors = reported_errors(output)
    assert status == 1 and sorted(errors) == [0, 1] and wall < 30, output
    assert "rank 0: caught init: timed out after 2" in output, output
    assert re.match(r"init: timed out after 4(\.\d+)? s waiting for every rank to make the runtime's communicator",
                    errors[0][1]), output
    assert re.match(r"init: timed out after 4(\.\d+)? s waiting for every rank to exchange the settings", errors[1][1]), \
        output
    for rank in (0, 1):
        assert f"[rank {rank}] collectives: exiting with status 1 without MPI_Finalize: a rank of this job did not " \
               "come to the runtime's setup" in output, output


@pytest.mark.skipif(mpi_name() != "MPICH", reason="the ranks beside one under MPICH's launcher's proxy are its siblings")
def test_a_rank_that_comes_to_setup_after_the_others_ended_fails_at_once_saying_so():
    """Under -disable-auto-cleanup, ranks 0 and 1 time out in their first call's setup (2 s) and end; rank 2
    comes afterwards with a timeout of 30 s, and must not wait it out for a setup nobody else is left for."""
    result = run_world(3, ["-m", "tests.programs.faults", "late-to-setup"], BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    errors = reported_errors(output)
    assert result.returncode not in (0, -9) and sorted(errors) == [0, 1, 2], output
    assert errors[2][0] < LEAVE_BOUND_S and errors[2][1] == (
        "init: a process of this job ended before every rank could make the runtime's communicator: 2 of the 3 "
        "processes the launcher started on this host have ended (given up waiting for this rank, or died); which "
        "rank cannot be known before the setup's exchange"), output
    assert "[rank 2] collectives: exiting with status 1 without MPI_Finalize: a process of this job ended before " \
           "the runtime was set up" in output, output


@pytest.mark.skipif(mpi_name() != "MPICH", reason="MPICH's launcher leaves the others inside MPI_Init")
def test_every_rank_left_inside_mpi_init_by_one_that_never_starts_mpi_says_so():
    """Under -disable-auto-cleanup, rank 1 never starts MPI: the others' MPI_Init waits for it, and
    each one's watch must say so at COLLECTIVES_TIMEOUT (3 s) before the first of them ends its rank
    (the first kill crashed the others' MPI_Init before their watches spoke: one line in 3 ranks)."""
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "never-starts-mpi"], BOUND_S,
                       env={"COLLECTIVES_TIMEOUT": "3"}, launcher_args=keep_survivors())
    output = result.stdout
    assert result.returncode not in (0, -9) and time.monotonic() - started < 30, output
    for rank in (0, 2):
        assert f"[rank {rank}] collectives: MPI_Init has not returned after 3 s (COLLECTIVES_TIMEOUT)" in output, output
    assert "MPI started after all" not in output, output


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_late_past_a_short_timeout_while_the_others_take_the_census_gets_their_outcome(n):
    """timeout=0.3 and rank 1 0.6 s late: the others' census of who is where waits up to 1 s for
    answers past their deadline (a short timeout asks half way). Rank 1 came meanwhile and completed
    the call with the data the others had sent, while they raised the timeout: the ranks split on
    whether the call happened. Every rank must end the call alike, whichever way."""
    _ended_alike(n, "x = np.ones(4) * (col.rank() + 1)\n"
                    "if col.rank() == 1: time.sleep(0.6)\n", timeout=0.3)


def _ended_alike(n: int, setup: str, timeout: float) -> str:
    """Run a world of ``n`` whose ranks, after a barrier and ``setup`` (which makes ``x``, and makes rank 1
    late), all-reduce ``x`` with ``timeout``; assert that every rank ended the call alike (and right,
    where it completed); return the output."""
    program = ("import sys, time, numpy as np, collectives as col\n"
               "col.barrier()\n"
               + setup +
               "try:\n"
               f"    total = col.allreduce(x, timeout={timeout})[0]\n"
               "    sys.stdout.write(f'rank {col.rank()}: completed {total}\\n')\n"
               "except col.CollectiveError as e:\n"
               "    sys.stdout.write(f'rank {col.rank()}: failed: {e}\\n')\n")
    output = run_world(n, ["-c", program], BOUND_S).stdout
    completed, failed = output.count("completed"), output.count("failed:")
    assert completed + failed == n and n in (completed, failed), output
    assert failed or output.count(f"completed {n * (n + 1) / 2}") == n, output
    return output


@pytest.mark.parametrize("n", [2, 3])
def test_a_call_every_rank_came_to_by_its_deadline_is_not_abandoned_while_the_late_ones_messages_come(n):
    """timeout=3: rank 1 comes 2.5 s late, after the others' census question (at 2 s), answers it from
    inside the call, and its data follows 0.9 s later (an array whose ``view`` takes that long: what a
    descheduled process does on a busy machine). The others raised at their deadline although the census
    said every rank was in the call (`rank(s) waiting in this call too: 0, 1`), and a rank that came
    within a message's latency of it completed the call alone. A call every rank answered from must wait
    for their messages (ROLL_CALL_GRACE past the deadline); where the machine was too busy for the
    question to come first, every rank still ends the call alike."""
    output = _ended_alike(n, "class Held(np.ndarray):\n"
                             "    hold = 0.0\n"
                             "    def view(self, *args, **kwargs):\n"
                             "        hold, Held.hold = Held.hold, 0.0\n"
                             "        time.sleep(hold)\n"
                             "        return super().view(*args, **kwargs)\n"
                             "x = (np.ones(4) * (col.rank() + 1)).view(Held)\n"
                             "if col.rank() == 1:\n"
                             "    time.sleep(2.5)\n"
                             "    Held.hold = 0.9\n", timeout=3)
    for rank, waiting in re.findall(r"on rank (\d): timed out after .*rank\(s\) waiting in this call too: ([\d, ]+)$",
                                    output, re.MULTILINE):
        assert waiting != ", ".join(str(r) for r in range(n) if r != int(rank)), output   # (every other rank)


@pytest.mark.parametrize("n", [2, 3])
def test_a_healthy_job_whose_ranks_end_further_apart_than_the_timeout_ends_well(n):
    """The timeout bounds calls, not a healthy job's exit: rank 1 ends its program 3 s after the
    others (COLLECTIVES_TIMEOUT=1), and every rank waits for it at exit (the exit's patience after a
    healthy run is for ever), saying once past the timeout which rank it waits for; the job ends
    with status 0."""
    program = ("import sys, time, numpy as np, collectives as col\n"
               "total = col.allreduce(np.ones(1))[0]\n"
               "if col.rank() == 1: time.sleep(3)\n"
               "sys.stdout.write(f'rank {col.rank()} done {total}\\n')")
    result = run_world(n, ["-c", program], BOUND_S, env={"COLLECTIVES_TIMEOUT": "1"})
    output = result.stdout
    assert result.returncode == 0 and output.count(f"done {float(n)}") == n, output
    waiting = "collectives: at exit, still waiting for rank(s) 1 after 1 s (COLLECTIVES_TIMEOUT): MPI_Finalize " \
              "waits for every rank (still in its own code?)"
    assert output.count(waiting) == n - 1 and output.count("collectives:") == n - 1, output
    assert "Traceback" not in output, output


def test_ctrl_c_while_a_healthy_rank_waits_at_exit_ends_it_saying_so():
    """Rank 0 waits at exit for rank 1, 30 s behind it, and says so past the timeout; a Ctrl-C then
    (the person at the keyboard gives up waiting) ends it with status 130 and one line, without
    MPI_Finalize: not a traceback from an exit handler, then MPI_Finalize waiting for rank 1."""
    program = ("import os, sys, time, collectives as col\n"
               "sys.stdout.write(f'rank {col.rank()} pid {os.getpid()}\\n')\n"
               "col.barrier()\n"
               "if col.rank() == 1: time.sleep(30)\n")
    process = subprocess.Popen([*mpiexec(), "-n", "2", sys.executable, "-c", program], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                                    "COLLECTIVES_TIMEOUT": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen, pid = [], None
        for line in process.stdout:   # (the cue: rank 0's line that it still waits)
            seen.append(line)
            pid = int(line.split()[-1]) if line.startswith("rank 0 pid ") else pid
            if "collectives: at exit, still waiting for rank(s) 1" in line:
                break
        assert pid is not None and seen and "still waiting" in seen[-1], "".join(seen)
        started = time.monotonic()
        os.kill(pid, signal.SIGINT)
        output = "".join(seen) + process.communicate(timeout=BOUND_S)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert time.monotonic() - started < 10 and process.returncode == 130, output
    assert "[rank 0] collectives: interrupted (Ctrl-C) at exit while waiting for rank(s) 1: exiting with status 130 " \
           "without MPI_Finalize" in output and "Traceback" not in output, output


def test_ctrl_c_in_the_farewell_itself_ends_the_rank_as_in_the_wait_at_exit():
    """A Ctrl-C that lands before the exit barrier (here in the farewell's first read of the control
    channel, where a tester's random Ctrl-C landed once in 100 launches) ends the rank as one in the
    barrier does: status 130 and one line, the other rank told. It escaped the exit handler, then
    MPI_Finalize waited for the other rank, and the other rank for its farewell: the job hung."""
    program = ("import os, signal, sys, collectives as col\n"
               "from ring.transport.mpi import exits\n"
               "col.barrier()\n"
               "sys.stdout.write(f'rank {col.rank()} done\\n')\n"
               "if col.rank() == 0:\n"
               "    first_read = exits.Exits.gone_at_exit\n"
               "    def interrupted(self):\n"
               "        os.kill(os.getpid(), signal.SIGINT)\n"
               "        return first_read(self)\n"
               "    exits.Exits.gone_at_exit = interrupted\n")
    started = time.monotonic()
    result = run_world(2, ["-c", program], BOUND_S)
    output = result.stdout
    # (the launcher's status is either rank's: 130, or 1 from rank 1, which leaves without rank 0's MPI_Finalize)
    assert result.returncode in (1, 130) and time.monotonic() - started < 30, output
    assert "[rank 1] collectives: exiting with status 1 without MPI_Finalize" in output, output
    assert output.count(" done") == 2 and "Traceback" not in output, output
    assert "[rank 0] collectives: interrupted (Ctrl-C) at exit" in output, output   # (while waiting for rank 1, or
    assert ": exiting with status 130 without MPI_Finalize" in output, output        # with every rank at exit)


def test_a_timeout_shorter_than_mpis_own_start_does_not_end_a_healthy_job_at_its_start():
    """COLLECTIVES_TIMEOUT=0.1 is a bound for calls (the program's own calls here take 60 s): MPI_Init
    takes longer than that, and its watch must not say that a process has ended, nor end the rank:
    MPI's start is given at least MPI_START_SECONDS."""
    program = ("import sys, numpy as np, collectives as col\n"   # (one write per line: three ranks share the pipe)
               "sys.stdout.write(f'sum {col.allreduce(np.ones(1), timeout=60)[0]}\\n')")
    result = run_world(3, ["-c", program], BOUND_S, env={"COLLECTIVES_TIMEOUT": "0.1"})
    output = result.stdout
    assert result.returncode == 0 and output.count("sum 3.0") == 3, output
    assert "MPI_Init has not returned" not in output, output


@pytest.mark.skipif(mpi_name() != "MPICH", reason="MPICH's launcher's proxy starts the ranks of its host")
@pytest.mark.parametrize("cleanup", [True, False])
def test_a_rank_that_ends_without_starting_mpi_ends_the_others_mpi_init_within_seconds(cleanup):
    """Rank 1 ends at once without starting MPI: the others' MPI_Init would wait for it until
    COLLECTIVES_TIMEOUT (60 s here; 600 by default); their watches see that a process the
    launcher's proxy started beside them has ended, and end them 5 s later, saying why."""
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "ends-without-mpi"], BOUND_S,
                       env={"COLLECTIVES_TIMEOUT": "60"}, launcher_args=() if cleanup else keep_survivors())
    output, wall = result.stdout, time.monotonic() - started
    assert result.returncode not in (0, -9) and wall < 30, output
    assert "rank 1: ending without MPI" in output and "MPI started after all" not in output, output
    for rank in (0, 2):
        assert f"[rank {rank}] collectives: MPI_Init has not returned 5 s after a process that MPICH's or Intel " \
               "MPI's mpiexec started on this host ended (1 of its 3 here)" in output, output


def test_a_farewell_setup_that_nobody_joins_still_ends_with_mpi_finalize_and_status_0():
    """A setup at exit that only says farewell and times out is not a setup the program missed: the
    process finalizes as usual (it ended with status 1 for a session, which killed healthy jobs
    whose ranks ended more than 10 s apart)."""
    status, output, _ = fault(2, "farewell-alone")
    assert status == 0 and "rank 0: done" in output and "rank 1: done after rank 0's farewell" in output, output
    assert "without MPI_Finalize" not in output, output


def test_after_a_timeout_the_census_tells_a_late_rank_from_an_absent_one():
    status, output, _ = fault(3, "late")
    errors = reported_errors(output)
    assert status not in (0, -9) and 0 in errors, output
    assert "waiting for rank 2; rank(s) not answering (in no collective call, computing between two messages of this one, or gone): 2; " \
           "rank(s) waiting in this call too: 1" in errors[0][1], errors[0][1]
    # rank 1, which came and waits with a longer timeout (30 s), learns by message that rank 0 gave up
    assert 1 in errors and errors[1][0] < LEAVE_BOUND_S and re.search(
        r"rank 0 (gave up \(its runtime stopped after 1 collective\(s\) of this group\)|left: it stopped after a "
        r"failure): allreduce #2 on rank 0: timed out", errors[1][1]), output


@pytest.mark.parametrize("n, call, others", [(2, "allreduce", "staying"), (3, "ring", "staying"),
                                             (2, "lane-allreduce", "staying"), (3, "lane-allreduce", "gone"),
                                             (2, "lane-broadcast", "staying"), (3, "lane-allgather", "gone"),
                                             (2, "lane-allgather", "staying"),
                                             (2, "direct-broadcast", "staying"), (2, "direct-allgather", "gone"),
                                             (2, "direct-allreduce", "staying"),
                                             (2, "barrier", "staying"), (3, "allreduce", "gone"),
                                             (3, "group-allreduce", "staying"), (2, "group-barrier", "gone")])
def test_a_rank_that_comes_after_the_others_timed_out_fails_the_call_too(n, call, others):
    """The others' data of the call reached the late rank before they gave up: completing it with that
    data would leave the ranks disagreeing on whether the call happened. The late rank hears why
    (their message when they gave up, or their farewell), at once: no wait of its own timeout (30 s).
    The late call is the second (the third through a lane, whose second call makes its exchange ready)."""
    status, output, _ = fault(n, "late-after-timeout", call, others)
    errors = reported_errors(output)
    assert "ok late call" not in output and status not in (0, -9), output
    assert sorted(errors) == list(range(n)), output
    for rank in (0, 2)[:n - 1]:   # (its own timeout, or the other's, whose give-up came first)
        assert re.search(rf"(allreduce|barrier|broadcast|allgather) #[23] on rank {rank}( in group \[[\d, ]+\])?: (rank \d (gave up|left: it stopped after) .*)?"
                         rf"timed out after 2(\.\d+)? s", errors[rank][1]), output
    seconds, message = errors[1]
    assert seconds < AT_ONCE_S, output   # (before any message: it had read the give-up at the call's start)
    assert re.search(r"(allreduce|barrier|broadcast|allgather) #[23] on rank 1( in group \[[\d, ]+\])?: rank [02] (gave up|"
                     r"left: it stopped after a failure).*(allreduce|barrier|broadcast|allgather) #[23] on rank \d( in group \[[\d, ]+\])?: timed out after 2",
                     message), output   # (rank 0 or 2: either may be heard first)


@pytest.mark.parametrize("n, call", [(2, "lane-allreduce"), (3, "lane-allreduce"), (2, "lane-broadcast"),
                                     (2, "lane-allgather")])
def test_a_rank_late_after_calls_with_an_infinite_timeout_fails_the_call_too(n, call):
    """The late rank's timeout is infinite (``init(timeout=inf)``), so is the window of its calls: a call
    after one of them is judged to come after a pause by when that one began (its last progress is not
    kept), and drains the others' words before it sends, though no MPI call moved them while it was
    away (before, on two ranks, its lane completed the call alone, 4 launches of 4)."""
    result = run_world(n, ["-m", "tests.programs.faults", "late-after-timeout", call, "ended", "inf"],
                       BOUND_S, launcher_args=keep_survivors())   # (the others end with status 3 before it calls)
    output = result.stdout
    errors = reported_errors(output)
    assert "ok late call" not in output and sorted(errors) == list(range(n)), output
    seconds, message = errors[1]
    assert seconds < AT_ONCE_S and re.search(rf"{call.removeprefix('lane-')} #4 on rank 1: rank [02] (gave up|left: "
                                             r"it stopped after a failure)", message), output


@pytest.mark.parametrize("n, collective", [(2, "allreduce"), (3, "allreduce"), (2, "broadcast"), (2, "allgather")])
def test_a_rank_stalled_inside_a_back_to_back_lane_call_until_the_others_timed_out_fails_it_too(n, collective):
    """Rank 1 runs a tight loop of small calls on a lane (every call back to back with its last) and is
    paused inside one, after it began and before its message left, until the others timed out of it:
    it fails the call too. A back-to-back call skips the look for a give-up only where the look itself
    comes within 0.1 ms of the last call's start (judged at the call's start instead, rank 1 completed
    the call alone: a helper's SIGSTOP between a call's start and its send, 5 launches in 33)."""
    result = run_world(n, ["-m", "tests.programs.faults", "stalled-in-a-lane-call", collective], BOUND_S)
    output = result.stdout
    errors = reported_errors(output)
    assert "ok late call" not in output and sorted(errors) == list(range(n)), output
    seconds, message = errors[1]
    assert re.search(rf"{collective} #\d+ on rank 1: rank [02] (gave up|left: it stopped after a failure)",
                     message), output


def test_a_rank_stalled_in_a_call_after_its_partner_went_on_reads_every_word_at_its_end():
    """At n = 3 rank 0 stalls inside a lane's all-reduce after its exchange with rank 1, before it
    forwards the result to rank 2, until rank 2 timed out of the call; rank 1 has gone on to the next
    call, whose message waits at rank 0 ahead of rank 2's word. Rank 0 fails the call too (its single
    test at the end found rank 1's message, and it completed the call alone: a tester's profiler pause,
    1 launch in 11). Rank 1, whose part ended before, fails the next call (docs/failures.md)."""
    result = run_world(3, ["-m", "tests.programs.faults", "stalled-before-forwarding"], BOUND_S)
    output = result.stdout
    errors = reported_errors(output)
    assert "rank 0: ok call" not in output and "rank 2: ok call" not in output, output
    assert sorted(errors) == [0, 1, 2] and "rank 1: ok call" in output, output
    assert re.search(r"allreduce #(\d+) on rank 0: rank 2 (gave up|left)", errors[0][1]), output
    assert re.search(r"allreduce #\d+ on rank 1: rank [02] (gave up|left)", errors[1][1]), output


def test_ranks_that_come_with_no_pause_to_a_call_a_rank_gave_up_fail_it_at_once():
    """With the check off a ring broadcast's root ends before the last rank; it gives up the next call
    while that rank is away. The two others come to it straight from the broadcast (no pause, so no
    drain at its start): they hear the give-up at their wait's first read and fail at once, not at
    the first look at the peers half a second later, nor after a drain for a death."""
    result = run_world(3, ["-m", "tests.programs.faults", "late-with-no-pause"], BOUND_S,
                       env={"COLLECTIVES_CHECK": "0"}, launcher_args=keep_survivors())
    output = result.stdout
    errors = reported_errors(output)
    assert "ok late call" not in output and sorted(errors) == [0, 1, 2], output
    for rank in (1, 2):
        seconds, message = errors[rank]
        assert seconds < AT_ONCE_S and "rank 0 gave up" in message, output


def test_a_rank_late_to_a_call_on_part_of_the_world_fails_it_after_the_others_words_queued_up():
    """Rank 1 comes to a call of the group [0, 1] once rank 0 timed out of it and ended, and rank 2,
    outside the group, ended too: the words of both at exit (farewells, the exit barrier's) reach
    rank 1 ahead of rank 0's on the group's channel, and MPICH moves one arrived message per probe,
    so two probes missed it and the late call completed alone. A call after a pause drains them."""
    result = run_world(3, ["-m", "tests.programs.faults", "late-on-a-part"], BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    errors = reported_errors(output)
    assert "ok late call" not in output and sorted(errors) == [0, 1], output
    assert re.match(r"allreduce #2 on rank 0 in group \[0, 1\]: timed out after 2", errors[0][1]), output
    assert errors[1][0] < LEAVE_BOUND_S and re.match(
        r"allreduce #2 on rank 1 in group \[0, 1\]: rank 0 (gave up|left: it stopped after a failure)", errors[1][1]), output


@pytest.mark.parametrize("n", [2, 3])
def test_a_call_that_keeps_moving_data_outlasts_its_timeout_and_one_that_hears_nothing_does_not(n):
    """The timeout bounds the time a call waits without progress, not the whole call: every message of
    a large all-reduce takes 0.1 s, the call more than its 1 s timeout in all, and it completes,
    right; a call that hears nothing for 1 s still raises, saying how long it waited: 1 s."""
    started = time.monotonic()
    result = run_world(n, ["-m", "tests.programs.faults", "slow-but-moving"], BOUND_S,
                       env={"COLLECTIVES_SEGMENT_BYTES": "65536"})
    output = result.stdout
    assert time.monotonic() - started < BOUND_S, output
    for rank in range(n):
        assert f"rank {rank}: slow call right, longer than its timeout: True" in output, output
    errors = reported_errors(output)
    assert sorted(errors) == list(range(n - 1)), output
    for rank, (seconds, message) in errors.items():
        assert re.search(r"allreduce #4 on rank \d: timed out after 1(\.\d+)? s waiting for rank", message), output
        assert (1 <= seconds or heard_first(message, rank)) and seconds < 1 + DEADLINE_SLACK_S, output


def test_a_timeout_names_the_absent_rank_where_the_rank_it_waits_for_waits_too():
    """Rank 0 waits for rank 2's message, and rank 2 for rank 3's, which never comes: rank 0's timeout
    says it waits for rank 3 (through rank 2), and so does what the others hear of it."""
    status, output, _ = fault(4, "absent-behind-a-waiting-rank")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1, 2], output
    assert errors[0][1].startswith("allreduce #2 on rank 0: timed out after 2") and \
        "waiting for rank 3 (here for a message from rank 2, which waits in this call too); rank(s) not answering " \
        "(in no collective call, computing between two messages of this one, or gone): 3; rank(s) waiting in " \
        "this call too: 1, 2" in errors[0][1], errors[0][1]
    for rank in (1, 2):
        assert re.findall(r"waiting for ranks? (\d+(?:, \d+)*)", errors[rank][1]) == ["3"], errors[rank][1]


def test_the_census_tells_a_rank_in_another_collective_of_the_same_number():
    status, output, _ = fault(4, "census-other-call")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1, 2], output
    census = ("rank(s) not answering (in no collective call, computing between two messages of this one, or gone): 3; "
              "rank(s) in another call: 2 (#2 barrier); rank(s) waiting in this call too: ")
    # rank 0 times out with its own census, or hears first that rank 1 (in the same allreduce) gave up,
    # whose census counts rank 0 as the one waiting beside it, or that rank 2 (in the barrier) did, whose
    # census names both in the allreduce; or, on a busy machine that ran it late, that rank 3 has ended
    # (cued once rank 2's call had ended)
    in_the_allreduce = "rank(s) in another call: 0 (#2 allreduce), 1 (#2 allreduce)"
    assert census + "1" in errors[0][1] or re.match(r"allreduce #2 on rank 0: rank [12] (gave up|left: it stopped after "
                                                    r"a failure)", errors[0][1]) and (
        census + "0" in errors[0][1] or in_the_allreduce in errors[0][1]) or \
        errors[0][1] == "allreduce #2 on rank 0: rank 3 ended its program after 1 collective(s)", output
    # rank 2 (in a barrier) times out with its own census, or hears first that rank 0 gave up (or left after it),
    # whose census names it
    assert in_the_allreduce in errors[2][1] or re.match(
        r"barrier #2 on rank 2: rank [01] (gave up|left: it stopped after a failure).*rank\(s\) in another call: 2 \(#2 barrier\)", errors[2][1]), output


def test_a_late_rank_in_another_call_of_the_same_number_is_named_so_and_not_waited_for():
    """With the check off, rank 0 comes 2.5 s late (after the others' census question, at 2 s) to a
    broadcast while the others wait in an allreduce (timeout=3): its answer at its call's start must say
    which collective it is in. It said nothing, and the others' census counted it as waiting in their
    call (and, since the census holds a call whose every rank answered from inside it past its deadline,
    they waited a second more for nothing)."""
    program = ("import time, numpy as np, collectives as col\n"
               "from tests.programs.cues import report\n"
               "col.barrier()\n"
               "if col.rank() == 0:\n"
               "    time.sleep(2.5)\n"
               "    report('call 2', col.broadcast, np.ones(4), root=0)\n"
               "else:\n"
               "    report('call 2', col.allreduce, np.ones(4), timeout=3)\n")
    result = run_world(3, ["-c", program], BOUND_S, env={"COLLECTIVES_CHECK": "0"})
    output = result.stdout
    errors = reported_errors(output)
    assert 1 in errors and 2 in errors, output
    for rank in (1, 2):
        assert "rank(s) in another call: 0 (#2 broadcast)" in errors[rank][1], output
        assert not re.search(r"waiting in this call too: 0\b", errors[rank][1]), output


@pytest.mark.parametrize("scenario, why", [
    ("uncaught", "rank 1 left: uncaught RuntimeError: user bug on rank 1 (after 3 collective(s))"),
    ("uncaught-own-hook", "rank 1 left: uncaught RuntimeError: user bug on rank 1 (after 3 collective(s))"),
    ("handled-by-interpreter", "rank 1 ended its program after 3 collective(s)"),
    ("handled-under-own-hook", "rank 1 ended its program after 3 collective(s)"),
    ("exits", "rank 1 ended its program after 3 collective(s)"),
    ("ctrl-c", "rank 1 left: uncaught KeyboardInterrupt (after 3 collective(s))"),
    ("skipped", "rank 1 ended its program after 4 collective(s)"),
])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_rank_that_leaves_fails_the_waiting_ranks_fast_naming_it(scenario, why, n):
    status, output, wall = fault(n, scenario)
    assert status not in (0, -9), output
    errors = reported_errors(output)
    waiting = [r for r in range(n) if r != 1]
    # MPICH's launcher may kill the others once a rank dies of a signal (Ctrl-C): each rank that
    # was not killed reports; every report names rank 1 and why it left, within the bound.
    assert errors or "signal 2" in output, output
    if scenario != "ctrl-c":
        assert sorted(errors) == waiting, output
    for rank, (seconds, message) in errors.items():
        assert rank in waiting and says_it_left(message, why) and seconds < LEAVE_BOUND_S, output
    assert wall < 30, output


@pytest.mark.skipif(mpi_name() != "MPICH", reason="MPICH's launcher's proxy kills the others when a rank dies of a signal")
@pytest.mark.parametrize("cleanup", [True, False])
def test_a_rank_that_ctrl_c_ends_outlasts_the_others_finishing_so_the_launcher_kills_none(cleanup):
    """Python ends a process that an uncaught KeyboardInterrupt ends by SIGINT, after its exit
    handlers; MPICH's proxy then SIGKILLs the other ranks, and mpiexec reports the job's statuses
    or'ed (2 | 9 = 11: "Segmentation fault"). The others here have finalized MPI and go on with their
    programs for 0.5 s: they end first, and the job's status is the interrupt's."""
    result = run_world(3, ["-m", "tests.programs.faults", "ctrl-c-as-the-others-finish"], BOUND_S,
                       launcher_args=() if cleanup else keep_survivors())
    for rank in (0, 2):
        assert f"rank {rank}: its program ended, 0.5 s after MPI_Finalize" in result.stdout, result.stdout
    assert "EXIT STRING: Interrupt (signal 2)" in result.stdout and "Killed" not in result.stdout, result.stdout


#: A main module's own code catches an exception on rank 1 and reports it through sys.excepthook, as a
#: program that logs and goes on would, then ends normally (the traceback starts at the bottom of the
#: stack, as an uncaught one's does).
REPORTED_AT_THE_TOP = """
import sys, numpy as np, collectives as col
from tests.programs.cues import report
col.allreduce(np.ones(4))
if col.rank() == 1:
    try:
        1 / 0
    except ZeroDivisionError:
        sys.excepthook(*sys.exc_info())
else:
    report("call 2", col.allreduce, np.ones(4))
"""


def test_an_exception_the_main_code_caught_and_reported_is_no_reason_to_leave():
    result = run_world(2, ["-c", REPORTED_AT_THE_TOP], BOUND_S)
    errors = reported_errors(result.stdout)
    assert "ZeroDivisionError" in result.stdout and sorted(errors) == [0], result.stdout
    assert says_it_left(errors[0][1], "rank 1 ended its program after 1 collective(s)"), result.stdout


@pytest.mark.parametrize("bound", ["call", "wait"])
def test_an_async_call_times_out_from_wait_on_every_rank(bound):
    status, output, wall = fault(3, "async-absent", bound)
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1] and wall < 30, output
    for rank, (seconds, message) in errors.items():
        assert (2 <= seconds or heard_first(message, rank)) and seconds < 2 + DEADLINE_SLACK_S, output
        if bound == "call":
            assert re.match(rf"allreduce #2 on rank {rank}: {HEARD_FIRST}timed out after 2(\.\d+)? s", message), output
        else:   # (its own wait ran out, or it heard first that the other's had)
            assert re.fullmatch(rf"allreduce #2 on rank {rank}( was stopped: rank {rank}|: rank \d gave up \(its runtime "
                                r"stopped after 1 collective\(s\) of this group\): rank \d): wait\(timeout=2\) for an "
                                "async allreduce ran out before the call finished", message), output


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_dies_with_handles_in_flight_fails_the_others_waits_fast(n):
    status, output, wall = fault(n, "async-uncaught")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [r for r in range(n) if r != 1] and wall < 30, output
    for seconds, message in errors.values():
        assert seconds < LEAVE_BOUND_S and says_it_left(
            message, "rank 1 left: uncaught RuntimeError: user bug on rank 1 (after 3 collective(s))"), output


@pytest.mark.parametrize("cleanup", [True, False])   # False: the launcher keeps the survivors (keep_survivors)
def test_a_late_rank_whose_call_differs_from_the_abandoned_one_does_not_hang_the_exit(cleanup):
    # Rank 1 finds the others' leftover messages disagree with its call and starts the all-gather that
    # reports it, which they, gone, never join: the exit barrier must not pair with that (it hung).
    started = time.monotonic()
    result = run_world(3, ["-m", "tests.programs.faults", "late-other-call"], BOUND_S,
                       launcher_args=() if cleanup else keep_survivors())
    output, wall = result.stdout, time.monotonic() - started
    errors = reported_errors(output)
    assert result.returncode not in (0, -9) and sorted(errors) == [0, 1, 2] and wall < 30, output
    for rank in (0, 2):
        # (the message has the seconds the wait itself lasted: an async call's deadline runs from its issue, a
        # little earlier, so it may read 1.99 s)
        # (or it heard first that the other gave up, after the other's own timeout)
        assert (2 <= errors[rank][0] or heard_first(errors[rank][1], rank)) and errors[rank][0] < 2 + DEADLINE_SLACK_S \
            and re.match(
            rf"allreduce #2 on rank {rank}: {HEARD_FIRST}timed out after (1\.9\d|2(\.\d+)?) s", errors[rank][1]), output
    # (rank 1 may hear rank 0 before rank 2: then it names rank 0, whose failure names rank 2's timeout; and
    # it may read a rank's give-up before its farewell)
    assert errors[1][0] < LEAVE_BOUND_S and re.match(r"allreduce #2 on rank 1: rank [02] (left: it stopped after a "
                                                     r"failure|gave up \(its runtime stopped after 1 collective\(s\) "
                                                     r"of this group\)): allreduce #2 on rank [02]: (rank [02] (gave "
                                                     r"up|left).*)?timed out", errors[1][1]), output

def test_ctrl_c_while_waiting_for_a_handle_stops_the_runtime_and_tells_the_others():
    status, output, _ = fault(3, "async-ctrl-c")
    assert "rank 1: KeyboardInterrupt inside wait" in output, output
    # Ctrl-C lands in the wait, or in the call itself where the waiting thread runs it (Engine.help)
    interrupted = ("(rank 1: interrupted by KeyboardInterrupt while waiting for an async allreduce|allreduce #4 on "
                   "rank 1 was interrupted by KeyboardInterrupt)")
    assert re.search("rank 1: then CollectiveError: allreduce: the runtime stopped after an earlier failure "
                     rf"\({interrupted}\)", output), output
    assert "WRONG" not in output and "Traceback" not in output, output
    errors = reported_errors(output)
    assert 2 in errors, output   # rank 0 may have had all it needed from rank 1 already (then its sum is right)
    for rank, (seconds, message) in errors.items():
        assert seconds < LEAVE_BOUND_S and re.search(r"rank 1 (left: it stopped after a failure|gave up \(its runtime "
                                                     rf"stopped after 3 collective\(s\) of this group\)): {interrupted}",
                                                     message), output   # (its give-up may come before its farewell)


def test_handles_a_program_leaves_unwaited_are_finished_at_exit():
    status, output, _ = fault(3, "async-dropped-at-exit")
    assert status == 0 and output.count("right") == 4 and "WRONG" not in output, output
    assert "Warning" not in output and "Traceback" not in output, output


def test_the_timeline_is_a_chrome_trace_with_a_track_per_rank_and_every_phase(tmp_path):
    path = tmp_path / "trace.json"
    result = run_world(3, ["-m", "tests.programs.faults", "timeline", "ok"], BOUND_S,
                       env={"COLLECTIVES_TIMELINE": str(path)})
    assert result.returncode == 0, result.stdout
    events = trace_events(path)
    assert {e["pid"] for e in events} == {0, 1, 2}
    spans = [e for e in events if e["ph"] == "X"]
    for rank in range(3):
        mine = [e for e in spans if e["pid"] == rank]
        calls = [e for e in mine if e["tid"] == 1 and " #" in e["name"]]
        assert [e["name"] for e in sorted(calls, key=lambda e: e["args"]["seq"])] == [
            "allreduce #1", "allreduce #2", "reduce_scatter #3", "allgather #4", "broadcast #5", "barrier #6",
            "allreduce #7"], calls
        assert calls[0]["args"]["bytes"] == 1_200_000 and calls[-1]["args"]["name"] == "last"
        ran = {e["name"]: e["args"].get("algorithm") for e in calls}   # (issue 26: which algorithm each ran)
        assert ran.pop("barrier #6") is None and set(ran.values()) <= {"doubling", "halving", "ring"}, ran
        phases = {e["name"] for e in mine if e["tid"] == 1 and " #" not in e["name"]}
        assert phases == {"check", "small", "reduce-scatter", "all-gather", "broadcast"}, phases
        program = {e["name"].split(" #")[0] for e in mine if e["tid"] == 0}
        assert {"my step", "wait allreduce", "wait reduce_scatter"} <= program, program
        for call in calls:   # every phase lies inside its call
            inside = [e for e in mine if e["tid"] == 1 and " #" not in e["name"]
                      and call["ts"] <= e["ts"] <= call["ts"] + call["dur"]]
            assert all(e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1 for e in inside)


def test_after_a_failure_each_rank_writes_its_own_timeline(tmp_path):
    path = tmp_path / "trace.json"
    result = run_world(3, ["-m", "tests.programs.faults", "timeline", "fail"], BOUND_S,
                       env={"COLLECTIVES_TIMELINE": str(path)})
    assert result.returncode not in (0, -9), result.stdout
    for rank in range(3):   # trace.json is only ever the merged trace
        assert {e["pid"] for e in trace_events(tmp_path / f"trace.rank{rank}.json")} == {rank}, result.stdout
    assert not path.exists(), result.stdout


def test_a_timeline_path_that_cannot_be_written_is_refused_at_setup(tmp_path):
    result = run_world(2, ["-m", "tests.programs.faults", "timeline", "ok"], BOUND_S,
                       env={"COLLECTIVES_TIMELINE": str(tmp_path / "missing" / "trace.json")})
    assert result.returncode not in (0, -9), result.stdout
    assert result.stdout.count(f"COLLECTIVES_TIMELINE / timeline: the directory {tmp_path / 'missing'} does not "
                               "exist") == 2, result.stdout


def test_a_rank_that_crashes_before_its_first_collective_is_named_at_setup():
    status, output, _ = fault(3, "crash-first")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 2], output
    for seconds, message in errors.values():
        assert seconds < LEAVE_BOUND_S and message == ("init: rank 1 left before its first collective: "
                                                       "uncaught OSError: cannot read the training data"), output


def test_a_rank_that_crashes_before_its_first_collective_is_named_to_a_rank_that_comes_later():
    """Rank 2 comes 3 s after rank 1 raised: rank 1, at exit, still waits in the setup to say why (up to
    10 s). The 3 s are the promise (longer than the 2 s grace of an exit after a failure)."""
    status, output, _ = fault(3, "crash-first-late")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 2], output
    for rank, (seconds, message) in errors.items():
        assert seconds < (3 if rank == 0 else 0) + LEAVE_BOUND_S and message == (
            "init: rank 1 left before its first collective: uncaught OSError: cannot read the training data"), output


def test_named_calls_turn_a_skipped_step_into_an_error_on_every_rank():
    status, output, _ = fault(3, "skipped-named")
    errors = reported_errors(output, "CollectiveUsageError")
    assert status not in (0, -9) and sorted(errors) == [0, 1, 2], output
    for _, message in errors.values():
        assert message == "allreduce: name: name differs across ranks: rank 0: grad step 2, rank 1: grad step 3"
    assert output.count("ok step") == 3 * 2, "steps 0 and 1 complete everywhere, nothing after"


def test_ctrl_c_inside_a_call_leaves_a_defined_state_and_a_clean_exit():
    status, output, _ = fault(3, "interrupted")
    assert "rank 1: KeyboardInterrupt inside the allreduce" in output, output
    assert "rank 1: then CollectiveError: allreduce: the runtime stopped after an earlier failure (allreduce #4 " \
           "on rank 1 was interrupted by KeyboardInterrupt)" in output, output
    assert "malloc" not in output and "WRONG DATA" not in output and "Traceback" not in output, output
    # the others come to the call rank 1 gave up, which its data had reached: they fail it too
    assert "the interrupted call returned" not in output, output
    for rank in (0, 2):
        assert f"rank {rank}: CollectiveError in the interrupted call: allreduce #4 on rank {rank}: rank 1 left: it " \
               "stopped after a failure: allreduce #4 on rank 1 was interrupted by KeyboardInterrupt (after 3 " \
               "collective(s))" in output, output
    assert status == 3, output   # rank 1 exits 0; the others stop on the error


@pytest.mark.parametrize("how", ["by-hand", "finalize", "initialize"])
def test_a_program_that_finalizes_mpi_itself_exits_cleanly(how):
    status, output, _ = fault(3, "finalize", how)
    assert status == 0 and output.count("sum right") == 3 and output.count("done") == 3, output
    assert "Traceback" not in output and "WARN" not in output, output


@pytest.mark.parametrize("what, expected", [
    ("segment", "CollectiveUsageError after [\\d.]+ s in first call: init: COLLECTIVES_SEGMENT_BYTES / "
                "segment_bytes differs across ranks: rank 0: 4194304, rank 1: 65536 \\(must be the same"),
    ("check", "CollectiveUsageError after [\\d.]+ s in init: init: COLLECTIVES_CHECK / check differs across "
              "ranks: rank 0: True, rank 1: False"),
    ("bad-env", "CollectiveUsageError after [\\d.]+ s in first call: init: COLLECTIVES_TIMEOUT: expected a "
                "positive number of seconds, got 'soon' \\(on rank 1; the runtime is not set up on any rank\\)"),
    ("huge-segment", "CollectiveUsageError after [\\d.]+ s in first call: init: COLLECTIVES_SEGMENT_BYTES: "
                     "expected a byte count from 0 \\(the defaults\\) to 1073741824"),
])
def test_settings_are_agreed_at_setup_and_every_rank_raises_alike(what, expected):
    status, output, _ = fault(3, "settings", what)
    assert status == 3, output
    for rank in range(3):
        assert re.search(f"rank {rank}: {expected}", output), output
    assert "WARN" not in output, output


@pytest.mark.parametrize("kind", ["sizes", "algorithms", "broadcast"])
def test_with_the_check_off_a_longer_message_is_named_not_corrupting(kind):
    """Whether MPI tells the error in a status or in a request, and whether the sender has left meanwhile
    (its part done), the receiver names the message that was too long."""
    status, output, wall = fault(2, "unchecked", kind)
    errors = reported_errors(output)
    assert status not in (0, -9) and wall < 30, output
    assert any(re.match(r"\w+ #\d+ on rank \d: a message from rank \d was longer than this rank expected", m)
               for _, m in errors.values()), output


def test_with_the_check_off_ranks_that_completed_another_call_and_ended_are_named_so():
    """Ranks that disagree about a call with the check off may each complete their own: the one left
    waiting times out, and its census says the others ended after completing the call as they saw it
    (not that they are in no call)."""
    status, output, wall = fault(3, "unchecked", "collectives")
    errors = reported_errors(output)
    assert status not in (0, -9) and wall < BOUND_S and sorted(errors) == [0], output
    assert errors[0][1].startswith("allreduce #1 on rank 0: timed out after 2") and errors[0][1].endswith(
        "rank(s) that ended their program after completing this call as they saw it (is the cross-rank check "
        "off?): 1, 2"), output


def test_rank_and_size_are_local():
    status, output, _ = fault(3, "rank-only")
    assert status == 0 and "rank 0: size 3" in output and output.count("ok allreduce") == 3, output


@pytest.mark.parametrize("n", [2, 3])
def test_two_threads_per_rank_never_get_wrong_data(n):
    status, output, _ = fault(n, "threads")
    outcomes = re.findall(r"rank \d+: threads \{'right': (\d+), 'refused': (\d+), 'wrong': (\d+)\}", output)
    assert status == 0 and len(outcomes) == n, output
    for right, refused, wrong in outcomes:
        assert int(wrong) == 0 and int(right) + int(refused) == 24, output


@pytest.mark.parametrize("n", [1, 2, 3])
def test_threads_that_make_the_first_call_at_once_all_get_the_answer(n):
    status, output, _ = fault(n, "first-from-threads")
    assert status == 0 and output.count("ok allreduce") == n, output
    for rank in range(n):
        assert f"rank {rank}: answers ['({rank}, {n})']" in output, output


@pytest.mark.parametrize("way", ["lane", "usual"])
@pytest.mark.parametrize("n", [2, 3])
def test_a_ctrl_c_as_a_call_ends_stops_the_runtime_so_a_retry_never_pairs_with_the_next_call(n, way):
    status, output, _ = fault(n, "interrupted-as-it-ends", way)
    assert "WRONG DATA" not in output and "Traceback" not in output, output
    assert "rank 1: KeyboardInterrupt in step 3" in output, output
    assert "rank 1: CollectiveError in step 3 (again): allreduce: the runtime stopped after an earlier failure " \
           "(allreduce #4 on rank 1 was interrupted by KeyboardInterrupt)" in output, output
    for rank in set(range(n)) - {1}:   # (the call was done on every rank; the next one fails, naming rank 1)
        assert f"rank {rank}: step 3 right" in output, output
        assert re.search(rf"rank {rank}: CollectiveError in step 4 \(first\): allreduce #5 on rank {rank}: "
                         rf"rank \d+ (left|gave up).*allreduce #4 on rank 1 was interrupted by KeyboardInterrupt",
                         output), output
    assert status == 0, output


@pytest.mark.parametrize("way", ["lane", "usual"])
@pytest.mark.parametrize("n", [2, 3])
def test_a_ctrl_c_right_after_a_call_took_the_engines_turn_hands_it_back_and_stops_the_runtime(n, way):
    """A tester's Ctrl-C at random moments of a loop of small calls hung 7 launches of 150: it landed
    right after the one function had taken the turn, before the try that hands it back, so the next
    call and the exit waited for it for ever (and the runtime was not stopped)."""
    status, output, _ = fault(n, "interrupted-as-the-turn-is-taken", way)
    assert "WRONG DATA" not in output and "Traceback" not in output, output
    assert "rank 1: KeyboardInterrupt in step 3" in output, output
    assert re.search(r"rank 1: CollectiveError in step 3 \(again\): allreduce: the runtime stopped after an "
                     r"earlier failure \(rank 1: allreduce was interrupted by KeyboardInterrupt\)", output), output
    assert "rank 1: the turn is handed back" in output, output
    for rank in set(range(n)) - {1}:   # (rank 1 never sent its part of step 3: the others fail it, naming rank 1)
        assert re.search(rf"rank {rank}: CollectiveError in step 3 \(first\): allreduce #4 on rank {rank}: "
                         rf"rank 1 (left|gave up)", output), output
    assert status == 0, output


def test_without_thread_support_only_the_main_thread_may_call():
    status, output, _ = fault(2, "funneled")
    assert status == 0, output
    for rank in range(2):
        assert (f"rank {rank}: from a thread: allreduce: called from thread 'loader', but MPI was started with "
                "MPI_THREAD_FUNNELED, so only the main thread may call it") in output, output
        assert f"rank {rank}: from the main thread: right" in output, output


def test_a_long_wait_does_not_burn_a_core():
    status, output, _ = fault(2, "idle")
    waited, cpu = map(float, re.search(r"waited ([\d.]+) s using ([\d.]+) s of CPU", output).groups())
    assert status == 0 and waited > 3.5, output
    assert cpu < 0.25 * waited, f"a rank waiting {waited:.1f} s used {cpu:.2f} s of CPU"


@pytest.mark.parametrize("n, elements, algorithm", [(3, 16 << 20, "ring"), (4, 1 << 20, "halving")])
def test_a_rank_killed_mid_allreduce_ends_the_job_fast(n, elements, algorithm):
    started = time.monotonic()
    result = run_world(n, ["-m", "tests.programs.faults", "killed", str(elements)], BOUND_S)
    assert time.monotonic() - started < 30, result.stdout
    assert f"algorithm: {algorithm}" in result.stdout, result.stdout
    assert result.returncode not in (0, -9) and "never noticed" not in result.stdout, result.stdout


@pytest.mark.skipif(mpi_name() != "MPICH", reason="MPICH's launcher's notice (SIGUSR1) to the survivors' shells")
def test_a_rank_killed_under_the_documented_shell_wrapper_is_named_by_every_survivor():
    """docs/failures.md's wrapper, which exits with the rank's status, under -disable-auto-cleanup:
    the shell traps the launcher's SIGUSR1 (a shell that died of it made the launcher kill the
    survivors it wrapped before they spoke) and hands the default action to Python."""
    wrapper = f"trap : USR1; {sys.executable} -m tests.programs.faults killed-between-calls; exit $?"
    result = run_world(3, ["sh", "-c", wrapper], BOUND_S, launcher_args=keep_survivors(), python=False)
    assert result.returncode not in (0, -9), result.stdout
    errors = reported_errors(result.stdout)
    assert sorted(errors) == [0, 2], result.stdout
    for rank, (seconds, message) in errors.items():
        assert message.startswith(f"allreduce #4 on rank {rank}: rank 1 is gone") and seconds < LEAVE_BOUND_S, \
            result.stdout
        assert f"[rank {rank}] collectives: exiting with status 1 without MPI_Finalize" in result.stdout, result.stdout


def test_a_dead_process_is_told_apart_from_a_live_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert _process_state(child.pid) == "has exited"
    assert _process_state(os.getpid()) is None


def test_a_rank_absent_from_a_groups_call_is_named_by_its_world_rank():
    status, output, wall = fault(3, "group-absent")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [1] and wall < BOUND_S, output
    group_call = re.search(r"rank 1: CollectiveError after ([\d.]+) s in group call: (.*)", output)
    assert group_call and 2 <= float(group_call[1]) < 2 + DEADLINE_SLACK_S, output
    assert re.match(r"allreduce #1 on rank 1 in group \[1, 2\]: timed out after 2(\.\d+)? s waiting for rank 2; "
                    r"rank\(s\) not answering \(in no collective call on this group, computing between two messages of this one, or gone\): 2$",
                    group_call[2]), output
    assert errors[1][1].startswith("barrier: the runtime stopped after an earlier failure (allreduce #1 on rank 1 "
                                   "in group [1, 2]: timed out"), output


def test_a_world_calls_census_does_not_say_a_rank_waiting_in_a_groups_call_is_in_none():
    """A rank answers the census on the channel of the group whose call it waits in: the world's census
    cannot hear a rank in a group's call, and where groups were made it says so."""
    status, output, wall = fault(3, "world-call-during-a-groups")
    errors = reported_errors(output)
    assert status not in (0, -9) and 0 in errors and wall < BOUND_S, output
    assert errors[0][1].startswith("allreduce #2 on rank 0: timed out after 2") and errors[0][1].endswith(
        "rank(s) not answering (in no call on the world (maybe in a group's), computing between two messages "
        "of this one, or gone): 1, 2"), output


def test_a_group_member_that_dies_ends_the_groups_and_the_worlds_calls():
    status, output, wall = fault(3, "group-member-dies")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1] and wall < BOUND_S, output
    why = "rank 2 left: uncaught RuntimeError: user bug on rank 2 (after 1 collective(s))"
    assert errors[1][1].startswith("allreduce #2 on rank 1 in group [1, 2]: rank 2 ") and says_it_left(errors[1][1], why)
    assert errors[0][1].startswith("barrier #2 on rank 0: rank 2 ") and says_it_left(errors[0][1], why), output
    assert all(seconds < LEAVE_BOUND_S for seconds, _ in errors.values()), output


def test_a_group_made_on_some_ranks_only_ends_when_the_last_rank_leaves():
    status, output, wall = fault(3, "group-partial")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1] and wall < BOUND_S, output
    for rank, (seconds, message) in errors.items():
        assert seconds < LEAVE_BOUND_S and message == f"new_group #2 on rank {rank}: rank 2 ended its program " \
                                                      "after 1 collective(s)", output


def test_a_group_of_its_members_alone_names_a_member_that_ended_at_once():
    status, output, wall = fault(3, "group-member-left")
    errors = reported_errors(output)
    assert status not in (0, -9) and sorted(errors) == [0, 1] and wall < 20, output
    for rank, (seconds, message) in errors.items():
        assert seconds < LEAVE_BOUND_S and message == f"new_group (members_only=True) on rank {rank}: rank 2 ended " \
                                                      "its program after 1 collective(s)", output


def test_init_with_a_communicator_makes_it_the_world():
    status, output, _ = fault(4, "group-comm")
    assert status == 0, output
    for world_rank in range(4):
        assert (f"rank {world_rank}: runtime rank {world_rank // 2} of 2, half rank {world_rank // 2} of 2, "
                "allreduce right") in output, output
        assert (f"rank {world_rank}: second init: init: comm: fixed when the runtime was set up (by the first init "
                "or collective); give it to the first init") in output, output
    assert ("rank 0: bad comm: init: comm: expected an mpi4py intracommunicator (like MPI.COMM_WORLD or one made "
            "by its Split), got str") in output, output
