"""The trainer, run as a user runs it (mpiexec ... python -m trainer), judged from its checkpoint files."""
import subprocess
import sys

import numpy as np
import pytest

from tests.worlds import ROOT, run_world
from trainer import checkpoint, data

TIMEOUT_S = 180
SMALL = ["--epochs", "3", "--dtype", "float64", "--batch-size", "50"]   # 50 does not divide by 3: uneven shards


def train(n, tmp_path, name, *flags):
    directory = tmp_path / name
    result = run_world(n, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), *flags], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    return directory, result.stdout


def final_params(directory):
    path, saved = checkpoint.newest_valid(directory)
    return saved["params"], saved["velocity"]


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
    _, log = train(2, tmp_path, "resumed", "--resume")
    assert "resuming from" in log
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


def test_default_run_reaches_95_percent_on_the_digits():
    result = run_world(2, ["-m", "trainer"], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    final = float(result.stdout.split("test accuracy ")[-1].split("%")[0])
    assert final >= 95.0, result.stdout[-2000:]


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "must be > 0"),
    (["--dataset", "imagenet"], "invalid choice"),
    (["--resume"], "--resume needs --checkpoint-dir"),
])
def test_bad_flags_give_a_message_and_non_zero_exit(flags, message):
    result = subprocess.run([sys.executable, "-m", "trainer", *flags], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr


def test_resume_without_checkpoints_fails_cleanly(tmp_path):
    result = run_world(2, ["-m", "trainer", "--checkpoint-dir", str(tmp_path / "empty"), "--resume"], TIMEOUT_S)
    assert result.returncode != 0 and "no usable checkpoint" in result.stdout and "Traceback" not in result.stdout
