"""Tier 2, issue 48, preemption: SIGTERM (a batch system's preemption or requeue, ``scancel``) stops every
rank of ``python -m trainer`` at the same step; rank 0 first writes a checkpoint of that step; the
job exits 143, which a batch script tells apart from a finish (0) or a failure. ``--resume`` on
an empty checkpoint directory starts from the beginning, so one command serves the first run
and every requeue, and a run preempted any number of times ends with the parameters of one that
never was."""
import os
import re
import signal

import pytest

from tests.support.trainer import finish, read_until, start
from tests.worlds import mpi_name, run_world


TIMEOUT_S = 180
LONG = ["--epochs", "5000"]   # still running when the signal comes: the epochs are cut short by it
DIGEST = re.compile(r"parameters identical on every rank \(blake2b (\w+)\)")


def pid_of(output: str, rank: int) -> int:
    """Rank ``rank``'s pid, from the trainer's "ranks (pid): 0 (123), 1 (456)" line."""
    pids = output.split("ranks (pid): ", 1)[1].split("  (", 1)[0]
    return int(pids.split(", ")[rank].split("(")[1].rstrip(")"))


def preempt(flags: list[str], rank: int | None, after: str = "epoch   2/") -> str:
    """Run the trainer on 2 ranks with ``flags``; SIGTERM once the output shows ``after``: to
    mpiexec (``rank`` None), as ``scancel`` signals a job step, or to one rank's pid alone."""
    process = start(2, [*LONG, *flags])
    output = read_until(process, after)
    if rank is None:
        process.terminate()
    else:
        os.kill(pid_of(output, rank), signal.SIGTERM)
    output += finish(process)
    assert process.returncode == 143, output
    return output


def stopped_at(output: str) -> tuple[int, str]:
    """The epoch a preempted run's one line says it stopped in, and the file of the checkpoint it
    names: a step's (``step S (inside epoch E)``) or, at an epoch's end, that epoch's."""
    lines = [line for line in output.splitlines() if line.startswith("preempted (SIGTERM) at epoch ")]
    assert len(lines) == 1, output
    found = re.search(r"^preempted \(SIGTERM\) at epoch (\d+), step \d+ of \d+; the last checkpoint is "
                      r"(?:step (\d+) \(inside epoch (\d+)\)|epoch (\d+)): --resume continues from it$", lines[0])
    assert found, output
    stopped, step, inside, ended = found.groups()
    if step:
        return int(stopped), f"checkpoint-epoch{int(inside) - 1:06d}_step{int(step):09d}.npz"
    return int(stopped), f"checkpoint-epoch{int(ended):06d}.npz"


def preempt_after(step: int, flags: list[str]) -> str:
    """Run the trainer on 2 ranks with ``flags``, rank 0 sending itself SIGTERM right after global
    step ``step`` (``tests/programs/preempt_after_step.py``: a signal from outside lands anywhere)."""
    result = run_world(2, ["tests/programs/preempt_after_step.py", str(step), *flags], TIMEOUT_S)
    assert result.returncode == 143, result.stdout
    return result.stdout


def digest(flags: list[str]) -> str:
    """The final parameter digest of a run of ``python -m trainer FLAGS`` on 2 ranks, which must finish."""
    result = run_world(2, ["-m", "trainer", *flags], TIMEOUT_S)
    assert result.returncode == 0, result.stdout
    return DIGEST.search(result.stdout).group(1)


@pytest.mark.skipif(mpi_name() == "Open MPI", reason="Open MPI's mpiexec kills the ranks on SIGTERM, as on "
                                                     "Ctrl-C (tests.worlds.killed_by_ctrl_c); one rank's is tested")
def test_sigterm_to_mpiexec_stops_every_rank_at_one_step_with_its_checkpoint(tmp_path):
    output = preempt(["--checkpoint-dir", str(tmp_path / "ckpt")], None)
    assert (tmp_path / "ckpt" / stopped_at(output)[1]).exists(), output
    for noise in ("Traceback", "KeyboardInterrupt", "BAD TERMINATION", "error"):
        assert noise not in output, output


def test_preempted_twice_and_requeued_the_run_ends_as_one_that_never_was(tmp_path):
    """The same command each time, ``--resume`` on an empty directory first; SIGTERM to one rank
    alone (the flag reaches the other in the step's all-reduce), twice; the third run finishes at
    the epoch after the second stop, with the digest of an uninterrupted run of as many epochs."""
    directory = str(tmp_path / "ckpt")
    first = preempt(["--checkpoint-dir", directory, "--resume"], 1)
    assert f"--resume: no checkpoint in {directory} yet: starting from the beginning" in first, first
    second = preempt(["--checkpoint-dir", directory, "--resume"], 0, after="ranks (pid)")
    assert f"resuming from {directory}/{stopped_at(first)[1]}" in second, second
    epoch, _ = stopped_at(second)
    epochs = ["--epochs", str(epoch + 1)]
    last = run_world(2, ["-m", "trainer", *epochs, "--checkpoint-dir", directory, "--resume"], TIMEOUT_S)
    never = run_world(2, ["-m", "trainer", *epochs], TIMEOUT_S)
    assert last.returncode == 0 and never.returncode == 0, last.stdout + never.stdout
    assert DIGEST.search(last.stdout).group(1) == DIGEST.search(never.stdout).group(1), last.stdout + never.stdout


@pytest.mark.parametrize("flags, after", [
    ([], 23),                                                # epoch 1's last step, its checkpoint just written
    (["--checkpoint-every", "2"], 23),                       # no checkpoint of epoch 1: the stop writes it
    (["--strategy", "diloco", "--sync-every", "10"], 24),    # back to the last sync: epoch 1's end
], ids=["checkpointed", "not-checkpointed", "diloco-back-to-it"])
def test_a_preemption_at_an_epoch_boundary_names_that_epochs_checkpoint(tmp_path, flags, after):
    """Issue 58: a SIGTERM right after an epoch's end wrote its state again as a step checkpoint and
    called epoch 1's last step (23 of the digits' 23 an epoch) "inside epoch 2". The state there is
    the epoch's: its checkpoint, written once, and named so; a resume ends as a run never stopped."""
    directory, run = tmp_path / "ckpt", ["--epochs", "3", *flags]
    output = preempt_after(after, [*run, "--checkpoint-dir", str(directory)])
    assert (f"preempted (SIGTERM) at epoch 2, step {after - 22} of 23; the last checkpoint is epoch 1: --resume "
            "continues from it") in output, output
    assert [p.name for p in directory.glob("checkpoint-*.npz")] == ["checkpoint-epoch000001.npz"], output
    assert digest([*run, "--checkpoint-dir", str(directory), "--resume"]) == digest(run)


def test_keep_bounds_the_checkpoints_of_a_job_requeued_many_times(tmp_path):
    """Issue 58: every preemption's step checkpoint stayed, whatever --keep said. With --keep 1 the
    directory holds the newest epoch checkpoint and, while it is the newest, the last stop's; the
    requeued job still ends as one never stopped."""
    directory = tmp_path / "ckpt"
    run = ["--epochs", "6", "--checkpoint-dir", str(directory), "--keep", "1"]

    def held():
        return sorted(p.name for p in directory.glob("checkpoint-*.npz"))

    preempt_after(30, [*run, "--resume"])
    preempt_after(40, [*run, "--resume"])   # inside epoch 2 again
    assert held() == ["checkpoint-epoch000001.npz", "checkpoint-epoch000001_step000000040.npz"]
    preempt_after(75, [*run, "--resume"])   # inside epoch 4
    assert held() == ["checkpoint-epoch000003.npz", "checkpoint-epoch000003_step000000075.npz"]
    assert digest([*run, "--resume"]) == digest(run[:2])
    assert held() == ["checkpoint-epoch000006.npz"]


def test_ctrl_c_still_reads_as_ctrl_c(tmp_path):
    """SIGINT and SIGTERM share the stop: Ctrl-C still exits 130 with its own line, and writes no
    step checkpoint (it is the user's stop, not a preemption)."""
    process = start(2, [*LONG, "--checkpoint-dir", str(tmp_path / "ckpt")])
    output = read_until(process, "epoch   2/")
    os.kill(pid_of(output, 1), signal.SIGINT)
    output += finish(process)
    assert process.returncode == 130 and "interrupted at epoch" in output, output
    assert not list((tmp_path / "ckpt").glob("*_step*.npz")), output


def test_a_late_sigterm_to_a_rank_on_its_way_out_does_not_change_the_status(tmp_path):
    """The batch system signals every task, and not at one instant: a SIGTERM that reaches a rank
    after the ranks agreed to stop (here, once rank 0 has said so) is the same preemption, come
    late: it must not kill that rank and end the job with status 15."""
    process = start(2, [*LONG, "--checkpoint-dir", str(tmp_path / "ckpt")])
    output = read_until(process, "epoch   2/")
    os.kill(pid_of(output, 0), signal.SIGTERM)
    output += read_until(process, "preempted (SIGTERM)")
    try:
        os.kill(pid_of(output, 1), signal.SIGTERM)
    except ProcessLookupError:
        pass   # (already gone: nothing late to test in this run)
    output += finish(process)
    assert process.returncode == 143 and "BAD TERMINATION" not in output, output
