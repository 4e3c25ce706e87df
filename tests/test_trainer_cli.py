"""Tier 2: the trainer's command line as users meet it (issue 28): Ctrl-C, a checkpoint directory that
holds another run, the communication shares of the epoch line, where the outputs went, --help."""
import json
import os
import signal
import subprocess
import sys

import pytest

from cmdline import interrupt as interrupt_module
from tests.support.trainer import finish, read_until, start
from tests.worlds import ROOT, killed_by_ctrl_c, mpi_name, run_world
from trainer import checkpoint


TIMEOUT_S = 180
OPEN_MPI = mpi_name() == "Open MPI"   # (its mpiexec does not pass Ctrl-C on: tests.worlds.killed_by_ctrl_c)
LONG = ["--epochs", "5000"]   # the digits: a few ms an epoch, so the run is still going when Ctrl-C comes


def interrupt(process: subprocess.Popen, after: str, pid_of_rank: int | None = None) -> str:
    """Ctrl-C once the output shows ``after``: to mpiexec, which passes it to every rank, as in a
    terminal, or to one rank alone (``pid_of_rank``, read from the trainer's "ranks (pid)" line)."""
    output = read_until(process, after)
    if pid_of_rank is None:
        process.send_signal(signal.SIGINT)
    else:
        pids = output.split("ranks (pid): ", 1)[1].split("  (", 1)[0]
        os.kill(int(pids.split(", ")[pid_of_rank].split("(")[1].rstrip(")")), signal.SIGINT)
    return output + finish(process)


@pytest.mark.parametrize("who", ["mpiexec", "rank 1 alone"])
def test_ctrl_c_stops_every_rank_at_the_same_step_with_one_line(tmp_path, who):
    directory = tmp_path / "ckpt"
    process = start(2, [*LONG, "--checkpoint-dir", str(directory)])
    output = interrupt(process, "epoch   3/", None if who == "mpiexec" else 1)
    if who == "mpiexec" and OPEN_MPI:
        assert killed_by_ctrl_c(process.returncode, output), output   # (what Open MPI does instead)
        return
    assert process.returncode == 130, output
    newest = int(sorted(directory.glob(checkpoint.PATTERN))[-1].name[len("checkpoint-epoch"):-len(".npz")])
    lines = [line for line in output.splitlines() if line.startswith("interrupted at epoch ")]
    assert len(lines) == 1 and lines[0].endswith(f"; the last checkpoint is epoch {newest}: --resume continues "
                                                 "from it"), output
    assert f"epoch {newest:3d}/5000" in output and f"epoch {newest + 2:3d}/5000" not in output, output
    for noise in ("Traceback", "KeyboardInterrupt", "BAD TERMINATION", "error"):
        assert noise not in output, output
    resumed = run_world(2, ["-m", "trainer", "--epochs", str(newest + 1), "--checkpoint-dir", str(directory),
                            "--resume"], TIMEOUT_S)
    assert resumed.returncode == 0 and f"epoch {newest + 1:3d}/{newest + 1}" in resumed.stdout, resumed.stdout


def test_a_second_ctrl_c_stops_this_rank_at_once():
    """The first Ctrl-C only raises the flag the ranks agree on; a second raises KeyboardInterrupt here.
    SIGTERM raises the preemption's flag, which wins over Ctrl-C's (its checkpoint must be written)."""
    found = signal.getsignal(signal.SIGINT)   # (Python's default_int_handler, or SIG_IGN in a background job)
    with interrupt_module.stop_together():
        signal.raise_signal(signal.SIGINT)   # (to this thread: its handler has run when this returns)
        assert interrupt_module.requested() == interrupt_module.CTRL_C
        signal.raise_signal(signal.SIGTERM)
        assert interrupt_module.requested() == interrupt_module.PREEMPTED
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert not interrupt_module.requested()   # leaving resets it, and restores Ctrl-C's handler
    assert signal.getsignal(signal.SIGINT) is found
    # after a preemption a late SIGTERM (another task's, the launcher's) must not kill the rank on its way out
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with interrupt_module.stop_together():
        pass
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # (no preemption: the handler as it was)


def test_ctrl_c_without_checkpoints_says_there_is_nothing_to_resume():
    process = start(3, [*LONG, "--no-overlap"])
    output = interrupt(process, "epoch   2/")
    if OPEN_MPI:
        assert killed_by_ctrl_c(process.returncode, output), output
        return
    assert process.returncode == 130, output
    assert output.count("; no checkpoint was written (--checkpoint-dir)") == 1, output


@pytest.mark.parametrize("who", ["mpiexec", "worker rank 1 alone", "server rank 2 alone"])
def test_ctrl_c_stops_parameter_servers_at_the_end_of_an_epoch(tmp_path, who):
    """A server's Ctrl-C (issue 36, item 3: it was ignored, the run went on to its end) reaches the
    workers in its next answer to a pull."""
    directory = tmp_path / "ckpt"
    process = start(3, [*LONG, "--strategy", "ps", "--checkpoint-dir", str(directory)])
    output = interrupt(process, "epoch   2/", {"mpiexec": None, "worker rank 1 alone": 1, "server rank 2 alone": 2}[who])
    if who == "mpiexec" and OPEN_MPI:
        assert killed_by_ctrl_c(process.returncode, output), output
        return
    assert process.returncode == 130, output
    last = [line for line in output.splitlines() if line.startswith("epoch ")][-1]
    epoch = int(last.split()[1].split("/")[0])
    assert output.count(f"interrupted at the end of epoch {epoch}; the last checkpoint is epoch {epoch}: "
                        "--resume continues from it") == 1, output
    assert sorted(directory.glob(checkpoint.PATTERN))[-1].name == f"checkpoint-epoch{epoch:06d}.npz"
    assert "Traceback" not in output and "BAD TERMINATION" not in output, output


def test_a_fresh_run_refuses_a_directory_holding_another_runs_checkpoints(tmp_path):
    directory = tmp_path / "ckpt"
    first = run_world(2, ["-m", "trainer", "--epochs", "2", "--checkpoint-dir", str(directory)], TIMEOUT_S)
    assert first.returncode == 0, first.stdout
    before = {p.name: p.stat().st_mtime_ns for p in directory.glob(checkpoint.PATTERN)}
    other = run_world(2, ["-m", "trainer", "--hidden", "32", "--checkpoint-dir", str(directory)], TIMEOUT_S)
    message = (f"error: --checkpoint-dir {directory}: holds an earlier run's checkpoints (2 checkpoints, "
               "checkpoint-epoch000001.npz to checkpoint-epoch000002.npz); continue that run with --resume, "
               "or give this one an empty directory")
    assert other.returncode == 2 and other.stdout.count(message) == 1 and "epoch   1/" not in other.stdout, \
        other.stdout
    assert {p.name: p.stat().st_mtime_ns for p in directory.glob(checkpoint.PATTERN)} == before
    resumed = run_world(2, ["-m", "trainer", "--epochs", "3", "--checkpoint-dir", str(directory), "--resume"],
                        TIMEOUT_S)
    assert resumed.returncode == 0 and "epoch   3/3" in resumed.stdout, resumed.stdout


@pytest.mark.parametrize("overlap", [[], ["--no-overlap"]], ids=["overlapped", "not overlapped"])
def test_exposed_communication_is_part_of_communication(tmp_path, overlap):
    metrics = tmp_path / "m.jsonl"
    result = run_world(2, ["-m", "trainer", "--epochs", "4", "--metrics", str(metrics), *overlap], TIMEOUT_S)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count(f"metrics written to {metrics} (one JSON object per epoch)") == 1, result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(records) == 4
    for r in records:
        assert 0 < r["exposed_comm_time"] <= r["comm_time"] < r["step_time"], r


@pytest.mark.quick
def test_help_states_each_default_once():
    result = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    text = " ".join(result.stdout.split())   # argparse wraps lines
    assert result.returncode == 0 and text.count("(default:") >= 20, text
    assert "(default: None)" not in text and "default: none) (default" not in text, text
    assert "--metrics METRICS write one JSON object per epoch to this file; with --resume, the epochs after the " \
           "checkpoint are replaced (default: none)" in text, text
    # (--resume-changed names every flag a resume compares with the checkpoint: it left out --compression)
    assert "--resume-changed with --resume: continue even where --dataset, --seed, --batch-size, --lr, --momentum, " \
           "--weight-decay, --sync-every, --outer-lr, --outer-momentum, --compression, --inner-state or --shards " \
           "differ from the checkpoint's" in text, text


@pytest.mark.parametrize("flags, says", [
    (["--hidden", "100000", "100000"], "--hidden 100000 100000: 10,007,600,010 parameters need about"),
    (["--dataset", "synthetic", "--samples", "1000000000000"], "--hidden 64 with --samples 1000000000000 "
                                                               "--features 256: 17,098 parameters and"),
])
def test_a_model_or_data_larger_than_the_hosts_memory_is_a_usage_error(flags, says):
    """Named before anything is allocated, on every rank alike (a MemoryError traceback before)."""
    result = run_world(2, ["-m", "trainer", *flags], TIMEOUT_S)
    assert result.returncode == 2 and says in result.stdout and "on this host, which has" in result.stdout, \
        result.stdout[-3000:]
    assert "Traceback" not in result.stdout and "MemoryError" not in result.stdout, result.stdout[-3000:]


def test_a_diverging_run_stops_on_every_rank_with_status_1(tmp_path):
    """--lr 1e300 trained on to `loss nan` and exited 0; now the epoch that diverged ends the run."""
    result = run_world(2, ["-m", "trainer", "--lr", "1e300", "--epochs", "3", "--checkpoint-dir", str(tmp_path)],
                       TIMEOUT_S)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "error: the training loss is nan after epoch 1: the model diverged (try a smaller --lr)" in result.stdout
    assert "done:" not in result.stdout and not list(tmp_path.glob("*.npz")), result.stdout[-3000:]


@pytest.mark.parametrize("which", ["SIGTERM", "SIGINT"])
def test_a_signal_that_comes_after_the_work_is_done_does_not_fail_the_finished_job(which):
    """A batch system's late SIGTERM (or a Ctrl-C) reaching one rank during its exit (its last lines,
    the exit barrier, MPI_Finalize) once training is done: the job still ends with status 0, and no
    rank prints a traceback."""
    result = run_world(2, ["-m", "tests.programs.late_signal", which, "1", "--epochs", "1"], TIMEOUT_S)
    assert "rank 1: sent itself" in result.stdout and "done: 1 epoch(s)" in result.stdout, result.stdout
    assert result.returncode == 0 and "Traceback" not in result.stdout, result.stdout


def test_after_the_work_sigterm_and_ctrl_c_are_ignored():
    """``stop_together(finishing=True)``: once the block returns the process is ending, so SIGTERM and
    SIGINT are ignored (set to SIG_IGN: Python's shutdown puts its own handlers back to the default
    action, which a late Ctrl-C then met); a block that raised puts the handlers back as they were."""
    found = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with interrupt_module.stop_together(finishing=True):
            pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGTERM, found[0])
        signal.signal(signal.SIGINT, found[1])
        with pytest.raises(ValueError), interrupt_module.stop_together(finishing=True):
            raise ValueError("the work failed")
        assert signal.getsignal(signal.SIGTERM) is found[0] and signal.getsignal(signal.SIGINT) is found[1]
    finally:
        signal.signal(signal.SIGTERM, found[0])
        signal.signal(signal.SIGINT, found[1])
