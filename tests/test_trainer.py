"""Tier 2: the trainer, run as a user runs it (mpiexec ... python -m trainer), judged from its checkpoint files."""
import errno
import os
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support.trainer import SMALL, TIMEOUT_S, final_params, train
from tests.worlds import ROOT, run_world
from trainer import checkpoint, data


SYNTHETIC_LONG = ["--dataset", "synthetic", "--samples", "20000", "--epochs", "50"]   # runs long enough to be in the way


def test_n_ranks_train_the_same_model_as_one(tmp_path):
    reference, _ = final_params(train(1, tmp_path, "n1")[0])
    for n in (2, 3):
        params, _ = final_params(train(n, tmp_path, f"n{n}")[0])
        np.testing.assert_allclose(params, reference, rtol=1e-9, atol=1e-12, err_msg=f"{n} ranks diverged from 1")
    other_seed, _ = final_params(train(1, tmp_path, "other-seed", "--seed", "1")[0])
    assert not np.allclose(other_seed, reference), "the comparison above could not have failed"


def test_resumed_run_ends_with_the_same_parameters(tmp_path):
    straight, _ = train(2, tmp_path, "straight")
    interrupted, _ = train(2, tmp_path, "resumed", "--epochs", "1")
    _, log = train(2, tmp_path, "resumed", "--resume", "--max-steps", "5")   # (past already: no step, no checkpoint)
    assert "--max-steps 5 was already past" in log and "(--max-steps)" not in log, log[-2000:]
    _, log = train(2, tmp_path, "resumed", "--resume")
    assert "resuming from" in log and "nothing to do" not in log
    _, log = train(2, tmp_path, "resumed", "--resume")   # (once more: every epoch is done)
    assert "nothing to do: the checkpoint already covers every epoch" in log and "done:" not in log, log[-2000:]
    steps_per_epoch = -(-len(data.digits("float64").train_y) // 50)
    assert int(checkpoint.newest_valid(interrupted)[1]["step"]) == 3 * steps_per_epoch
    for a, b in zip(final_params(straight), final_params(interrupted)):
        np.testing.assert_array_equal(a, b)


def test_corrupt_newest_checkpoint_is_reported_and_skipped(tmp_path):
    directory, _ = train(2, tmp_path, "ckpt", "--epochs", "2")
    newest = sorted(directory.glob("checkpoint-epoch*.npz"))[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])   # truncated, as by a crash
    result = run_world(2, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), "--resume"], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "skipping checkpoint" in result.stdout and "epoch 1 done" in result.stdout


@pytest.mark.quick
def test_default_run_reaches_95_percent_on_the_digits():
    result = run_world(2, ["-m", "trainer"], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    final = float(result.stdout.split("test accuracy ")[-1].split("%")[0])
    assert final >= 95.0, result.stdout[-2000:]


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "--epochs: must be >= 1, got 0"),
    (["--dataset", "imagenet"], "invalid choice"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--lr", "nan"], "--lr: must be a finite number, got nan"),
    (["--lr", "inf"], "--lr: must be a finite number, got inf"),
    (["--momentum", "nan"], "--momentum: must be a finite number, got nan"),
    (["--weight-decay", "inf"], "--weight-decay: must be a finite number, got inf"),
    (["--seed", "-5"], "--seed: must be >= 0, got -5"),
    (["--dataset", "synthetic", "--samples", "1"], "--samples: must be >= 5, got 1"),
    (["--epoch", "3"], "unrecognized arguments: --epoch 3"),
    (["--resume-changed"], "--resume-changed goes with --resume"),
])
def test_bad_flags_give_one_message_and_exit_2(flags, message):
    result = run_world(2, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "Traceback" not in result.stdout and "training [" not in result.stdout, result.stdout


@pytest.mark.parametrize("flag", ["--plot", "--metrics"])
def test_an_output_in_a_missing_directory_is_refused_before_training(tmp_path, flag):
    target = tmp_path / "missing" / "out.png"
    result = run_world(2, ["-m", "trainer", flag, str(target)], 60)
    message = f"error: {flag} {target}: the directory {target.parent} does not exist"
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "training [" not in result.stdout and "Traceback" not in result.stdout, result.stdout


def test_a_checkpoint_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "ckpt"
    target.write_text("not a directory")
    result = run_world(2, ["-m", "trainer", "--checkpoint-dir", str(target)], 60)
    assert result.returncode == 2 and result.stdout.count("is a file, not a directory") == 1, result.stdout


def test_two_runs_cannot_share_a_checkpoint_dir(tmp_path):
    directory = tmp_path / "shared"
    first = subprocess.Popen([sys.executable, "-m", "trainer", *SYNTHETIC_LONG, "--checkpoint-dir", str(directory)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lock, deadline = directory / checkpoint.LOCK, time.monotonic() + 60
        while time.monotonic() < deadline and first.poll() is None:   # until the first run holds the lock
            if lock.exists() and lock.read_text() == f"pid {first.pid}":   # (written once the lock is taken)
                break
            time.sleep(0.05)
        second = run_world(2, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory)], 60)
    finally:
        first.kill()
        first.communicate()
    message = f"error: --checkpoint-dir {directory}: in use by another training run (pid {first.pid})"
    assert second.returncode == 2 and second.stdout.count(message) == 1, second.stdout
    # the lock ends with its process: a later run may use the directory (once the killed run's checkpoints,
    # which a fresh run refuses to write among, are gone)
    for left in directory.glob(checkpoint.PATTERN):
        left.unlink()
    train(1, tmp_path, "shared", "--epochs", "1")


def test_resume_with_other_settings_is_refused_unless_asked(tmp_path):
    directory, _ = train(2, tmp_path, "ckpt", "--epochs", "1")
    result = run_world(2, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), "--resume", "--seed", "3",
                           "--lr", "0.1"], TIMEOUT_S)
    message = "error: --resume: this run changes the checkpoint's settings (--seed 0 -> 3, --lr 0.05 -> 0.1)"
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "epoch   2" not in result.stdout
    _, log = train(2, tmp_path, "ckpt", "--resume", "--seed", "3", "--lr", "0.1", "--resume-changed")
    assert "resuming from" in log and "epoch   3/3" in log


def test_a_failed_checkpoint_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    checkpoint.save(tmp_path, 1, 1, {"params": np.ones(3)}, {"seed": 0}, keep=3)
    monkeypatch.setattr(checkpoint.np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, 2, 2, {"params": np.ones(3)}, {"seed": 0}, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-epoch000001.npz"]


def test_keep_counts_only_this_runs_checkpoints(tmp_path):
    """Adversarial round of issue 36: a note named like a later checkpoint was counted by --keep, which
    then removed every real checkpoint and kept the note (the next --resume found nothing)."""
    note = tmp_path / "checkpoint-epoch000009.npz"
    note.write_text("notes")
    for epochs in (1, 2, 3):
        checkpoint.save(tmp_path, epochs, epochs, {"params": np.full(3, epochs)}, {"seed": 0}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-epoch000002.npz", "checkpoint-epoch000003.npz",
                                                          "checkpoint-epoch000009.npz"]
    path, saved = checkpoint.newest_valid(tmp_path, report=lambda line: None)
    assert path.name == "checkpoint-epoch000003.npz" and saved["params"][0] == 3


def test_keep_bounds_step_checkpoints_too(tmp_path):
    """Issue 58: every preemption of a requeued job wrote a step checkpoint and --keep removed none.
    --keep K keeps the newest K epoch checkpoints, and a step checkpoint only while it is the newest
    of all; a checkpoint named for a later point (skipped when this run resumed) stays."""
    later = tmp_path / "checkpoint-epoch000009_step000000095.npz"
    later.write_bytes(b"PK\x03\x04 cut short")

    def save(epochs, step, partial=False):
        checkpoint.save(tmp_path, epochs, step, {"params": np.full(3, step)}, {"seed": 0}, keep=2, partial=partial)

    def names():
        return sorted(p.name for p in tmp_path.glob(checkpoint.PATTERN) if p != later)

    for epochs in (1, 2, 3):
        save(epochs, 10 * epochs)
    for step in (31, 34, 38):   # preempted inside epoch 4, requeued, preempted again, ...
        save(3, step, partial=True)
    assert names() == ["checkpoint-epoch000002.npz", "checkpoint-epoch000003.npz",
                       "checkpoint-epoch000003_step000000038.npz"]
    save(4, 40)
    assert names() == ["checkpoint-epoch000003.npz", "checkpoint-epoch000004.npz"] and later.exists()


def test_resume_with_another_compression_is_refused_unless_asked(tmp_path):
    """Issue 58: a resume with another --compression took the checkpoint's error-feedback residuals
    (another codec's rounding) or dropped them without a word. It is refused as the other settings
    are; with --resume-changed, or on another strategy (whose residual is of other numbers), rank 0
    says once that they are dropped."""
    directory, _ = train(2, tmp_path, "ckpt", "--epochs", "1", "--compression", "bf16")
    for other in ("fp16", "none"):
        result = run_world(2, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), "--resume",
                               "--compression", other], TIMEOUT_S)
        message = (f"error: --resume: this run changes the checkpoint's settings (--compression bf16 -> {other}); "
                   "give the same flags, or add --resume-changed to continue with the new ones")
        assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    dropped = "--resume: the checkpoint's error-feedback residuals are dropped (they are of {}): at most one step's " \
              "rounding is lost"
    _, log = train(2, tmp_path, "ckpt", "--epochs", "2", "--resume", "--compression", "fp16", "--resume-changed")
    assert log.count(dropped.format("--compression bf16 and this run has --compression fp16")) == 1, log
    _, log = train(2, tmp_path, "ckpt", "--resume", "--compression", "fp16", "--strategy", "diloco")
    assert log.count(dropped.format("--strategy allreduce and this run has --strategy diloco")) == 1, log


def test_resume_without_checkpoints_starts_from_the_beginning_and_says_so(tmp_path):
    """One batch script for the first run and every requeue (issue 48): no checkpoint yet is a start."""
    directory = tmp_path / "empty"
    result = run_world(2, ["-m", "trainer", "--epochs", "2", "--checkpoint-dir", str(directory), "--resume"], TIMEOUT_S)
    assert result.returncode == 0 and f"--resume: no checkpoint in {directory} yet: starting from the beginning" in \
        result.stdout and "epoch   2/2" in result.stdout, result.stdout


def test_resume_where_every_checkpoint_is_damaged_fails_cleanly(tmp_path):
    """Checkpoints that none verifies are not "none yet": starting over would throw a run away silently."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint-epoch000003.npz").write_bytes(b"PK\x03\x04 cut short")
    result = run_world(2, ["-m", "trainer", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume"], TIMEOUT_S)
    assert result.returncode == 2 and "no usable checkpoint" in result.stdout and "Traceback" not in result.stdout, \
        result.stdout


def test_checkpoints_are_numbered_as_the_log_counts_epochs(tmp_path):
    directory, log = train(2, tmp_path, "numbered", "--epochs", "2")
    assert sorted(p.name for p in directory.glob("checkpoint-*.npz")) == ["checkpoint-epoch000001.npz",
                                                                          "checkpoint-epoch000002.npz"]
    assert "epoch   2/2" in log
    _, resumed = train(2, tmp_path, "numbered", "--epochs", "3", "--resume")
    assert "checkpoint-epoch000002.npz (epoch 2 done)" in resumed and "epoch   3/3" in resumed


def test_metrics_stay_the_record_of_one_run_after_a_crash_between_checkpoints(tmp_path):
    metrics, picture = tmp_path / "m.jsonl", tmp_path / "curves.png"
    directory, _ = train(2, tmp_path, "ckpt", "--checkpoint-every", "2", "--metrics", str(metrics))
    (directory / "checkpoint-epoch000003.npz").unlink()   # as if it crashed after epoch 3's metrics line
    train(2, tmp_path, "ckpt", "--epochs", "4", "--resume", "--metrics", str(metrics), "--plot", str(picture))
    epochs = [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()]
    assert epochs == [1, 2, 3, 4], epochs
    assert picture.stat().st_size > 0


@pytest.mark.parametrize("flags, message", [
    (["--features", "10"], "--features: only for --dataset synthetic"),
    (["--batch-size", "5000"], "--batch-size 5000 is larger than the training set (1438 samples of digits)"),
])
def test_flags_that_do_not_apply_are_refused_once(flags, message):
    result = run_world(2, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "training [" not in result.stdout


@pytest.mark.quick
def test_version():
    result = subprocess.run([sys.executable, "-m", "trainer", "--version"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("python -m trainer (ringcollectives "), result


def test_the_synthetic_set_is_learnable_but_not_trivial():
    d = data.synthetic(4000, 64, 10, "float64")
    again = data.synthetic(4000, 64, 10, "float64")
    assert np.array_equal(d.train_x, again.train_x) and np.array_equal(d.train_y, again.train_y)
    onehot = np.eye(10)[d.train_y]
    weights, *_ = np.linalg.lstsq(np.c_[d.train_x, np.ones(len(d.train_x))], onehot, rcond=None)
    accuracy = np.mean((np.c_[d.test_x, np.ones(len(d.test_x))] @ weights).argmax(axis=1) == d.test_y)
    assert 0.3 < accuracy < 0.9, accuracy   # far above chance (0.1), far from solved


@pytest.mark.parametrize("env, expected", [
    ({}, "note: running 1 rank: no MPI launcher started this process (mpirun -n 4 python -m trainer runs 4)"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "note: running 1 rank, but Open MPI's mpirun started 4 (OMPI_COMM_WORLD_SIZE=4)"),
])
def test_a_world_of_one_rank_says_why(env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")}
    result = subprocess.run([sys.executable, "-m", "trainer", "--epochs", "1"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={**clean, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 0 and result.stdout.count(expected) == 1, result.stdout + result.stderr


def test_a_world_of_one_asked_for_has_no_note():
    result = run_world(1, ["-m", "trainer", "--epochs", "1"], 120)
    assert result.returncode == 0 and "note:" not in result.stdout, result.stdout


@pytest.mark.parametrize("overlap", [[], ["--no-overlap"]], ids=["overlapped", "no-overlap"])
def test_overlapped_buckets_train_the_same_model_as_one_rank(tmp_path, overlap):
    """Issue 13: n = 1, 2, 4 agree within 1e-5 (float32) after 2 epochs, with small buckets (several per
    step, so that overlap really happens) and without; every rank holds identical bits."""
    flags = ["--epochs", "2", "--dtype", "float32", "--hidden", "64", "32", "--bucket-mb", "0.001", *overlap]
    runs = {}
    for n in (1, 2, 4):
        directory = tmp_path / f"n{n}"
        result = run_world(n, ["-m", "trainer", "--checkpoint-dir", str(directory), "--metrics",
                               str(tmp_path / f"m{n}.jsonl"), *flags], TIMEOUT_S,
                           env={"COLLECTIVES_TIMELINE": str(tmp_path / f"trace{n}.json")})
        assert result.returncode == 0 and "parameters identical on every rank" in result.stdout, result.stdout[-4000:]
        runs[n] = final_params(directory)[0]
        record = json.loads((tmp_path / f"m{n}.jsonl").read_text().splitlines()[-1])
        assert 0 <= record["exposed_comm_time"] <= record["step_time"] and record["comm_time"] >= 0, record
        trace = json.loads((tmp_path / f"trace{n}.json").read_text())["traceEvents"]
        buckets = {e["name"].split(" #")[0] for e in trace if e.get("ph") == "X" and e.get("tid") == 1}
        assert {e["pid"] for e in trace} == set(range(n)) and "allreduce" in buckets, buckets
    for n in (2, 4):
        np.testing.assert_allclose(runs[n], runs[1], rtol=1e-5, atol=1e-6, err_msg=f"{n} ranks diverged from 1")


TENSOR = ["--hidden", "32", "16", "--epochs", "2"]   # layers: column, row, whole


def test_tensor_parallel_trains_the_same_model_as_one_rank(tmp_path):
    reference, _ = final_params(train(1, tmp_path, "n1", *TENSOR)[0])
    for n in (2, 4):
        directory, log = train(n, tmp_path, f"n{n}-tp2", *TENSOR, "--tensor-parallel", "2",
                               "--metrics", str(tmp_path / f"n{n}.jsonl"))
        params, _ = final_params(directory)
        np.testing.assert_allclose(params, reference, rtol=1e-5, atol=1e-9,
                                   err_msg=f"--tensor-parallel 2 on {n} ranks diverged from 1 rank")
        layout = f"{n // 2} x 2 (dp x tp)"
        assert f"with {n} rank(s) as {layout}" in log and log.count(f"  {layout}\n") == 2, log
        assert "parameters identical on every rank" in log, log
        records = [json.loads(line) for line in (tmp_path / f"n{n}.jsonl").read_text().splitlines()]
        assert [(r["layout"], r["dp"], r["tp"]) for r in records] == [(layout, n // 2, 2)] * 2


@pytest.mark.parametrize("first, then", [("2", "1"), ("1", "2")])
def test_a_checkpoint_resumes_at_another_tensor_parallel_split(tmp_path, first, then):
    straight, _ = train(2, tmp_path, "straight", *TENSOR)
    directory, _ = train(2, tmp_path, "switched", *TENSOR, "--epochs", "1", "--tensor-parallel", first)
    _, log = train(2, tmp_path, "switched", *TENSOR, "--resume", "--tensor-parallel", then)
    assert "resuming from" in log and f"as {2 // int(then)} x {then} (dp x tp)" in log, log
    for resumed, expected in zip(final_params(directory), final_params(straight)):
        np.testing.assert_allclose(resumed, expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("n, flags, message", [
    (3, ["--tensor-parallel", "2"], "--tensor-parallel 2: 3 rank(s) do not split into groups of 2 (the number "
                                    "of ranks must be a multiple of T)"),
    (2, ["--tensor-parallel", "2", "--hidden", "33", "8"], "--tensor-parallel 2: the split layers' widths [33] "
                                                          "(of --hidden) are not multiples of 2"),
])
def test_a_tensor_parallel_split_that_does_not_fit_is_a_usage_error(tmp_path, n, flags, message):
    result = run_world(n, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and f"error: {message}" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("strategy", ["allreduce", "ps"])
def test_tensorboard_files_hold_the_metrics(tmp_path, strategy):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board, metrics = tmp_path / "board", tmp_path / "m.jsonl"
    result = run_world(3, ["-m", "trainer", *SMALL, "--strategy", strategy, "--metrics", str(metrics),
                           "--tensorboard", str(board)], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.count(f"TensorBoard event files written to {board} (tensorboard --logdir {board})") == 1
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    events = EventAccumulator(str(board))
    events.Reload()
    keys = ["loss", "train_accuracy", "test_accuracy", "samples_per_sec", "exposed_comm_time"]
    keys += ["staleness_mean", "staleness_max", "updates"] if strategy == "ps" else []
    assert set(keys) <= set(events.Tags()["scalars"]), events.Tags()
    for key in keys:
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [r["epoch"] for r in records], key
        np.testing.assert_allclose([s.value for s in scalars], [r[key] for r in records], rtol=1e-6, err_msg=key)


def test_tensorboard_without_its_extra_says_what_to_install():
    code = ("import sys; sys.modules['tensorboardX'] = None; from trainer.__main__ import run; "
            "run(['--tensorboard', 'board'])")
    result = run_world(1, ["-c", code], 60)
    assert result.returncode == 2 and ("--tensorboard needs tensorboardX: pip install -e '.[tensorboard]'"
                                       in result.stdout), result.stdout[-2000:]


def test_taking_a_checkpoint_directory_removes_what_a_writer_that_died_left_half_written(tmp_path):
    """The chief killed mid-save leaves its temporary file; the next run that takes the directory's
    lock (so no writer can be alive) removes it, and nothing else."""
    left = tmp_path / ".checkpoint-epoch000003.npz.k2j4x9.tmp"
    left.write_bytes(b"half a checkpoint")
    kept = tmp_path / "checkpoint-epoch000002.npz"
    kept.write_bytes(b"a finished one")
    checkpoint.lock(tmp_path)
    assert not left.exists() and kept.exists()
