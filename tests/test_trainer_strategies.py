"""Tier 2, issue 49: ``--strategy local-sgd`` and ``diloco`` (replicas that meet every ``--sync-every`` steps), and
``--compression`` with error feedback, run as a user runs them (mpiexec ... python -m trainer), judged
from the printed digest and the checkpoint files, against one-process references of the same arithmetic."""
import os
import re
import signal

import numpy as np

import pytest

import collectives as col
from tests.support.strategies import DIGEST, PER_EPOCH, TIMEOUT_S, newest, train
from tests.support.trainer import ends_as_a_restart, finish, read_until, start, trainer_killing
from tests.worlds import run_world
from trainer import compression, data
from trainer.model import MLP
from trainer.optim import SGD


@pytest.mark.parametrize("n", [1, 2, 3])
def test_replicas_end_identical_and_local_sgd_every_step_is_the_allreduce_training(tmp_path, n):
    """Every strategy ends with identical replicas (the digest line: each rank's compared). Local SGD
    with H = 1 is the all-reduce strategy in exact arithmetic (trainer/strategies/local_sgd.py): on one
    rank the same bits, for any H (the average of one replica is itself); on 2 and 3 ranks the same up
    to rounding (the replicas' steps are averaged instead of their gradients: float64, 2 epochs)."""
    plain, _, digest = train(n, tmp_path, "allreduce")
    every, _, every_digest = train(n, tmp_path, "local1", "--strategy", "local-sgd", "--sync-every", "1")
    train(n, tmp_path, "diloco", "--strategy", "diloco", "--sync-every", "4")
    if n == 1:
        _, _, rarely = train(n, tmp_path, "local7", "--strategy", "local-sgd", "--sync-every", "7")
        assert every_digest == digest == rarely
    for name in ("params", "velocity"):
        np.testing.assert_allclose(newest(every)[name], newest(plain)[name], rtol=1e-9, atol=1e-12, err_msg=name)
    _, _, other = train(n, tmp_path, "local4", "--strategy", "local-sgd", "--sync-every", "4")
    assert n == 1 or other != digest, "H = 4 trained the same model as H = 1: the comparison could not fail"


def reference_diloco(n: int, h: int, syncs: int, lr=0.05, momentum=0.9, decay=1e-4, outer_lr=0.5, outer_m=0.5):
    """DiLoCo in one process: n replicas of SMALL's model, each H inner steps on its shard of each
    global batch (scaled by n / batch, as Periodic.local_step), then the deltas and momenta averaged
    ((a + b) / n: the all-reduce's "avg") and the outer Nesterov step; ``syncs`` times."""
    d = data.digits("float64")
    model = MLP([64, 16, 10], np.random.default_rng(0), np.float64)
    anchor, outer = model.flat_params.copy(), np.zeros_like(model.flat_params)
    velocity = np.zeros_like(anchor)
    for s in range(syncs):
        params, velocities = [], []
        for r in range(n):
            model.flat_params[...] = anchor
            opt = SGD(model.flat_params, lr, momentum, decay)
            opt.velocity[...] = velocity
            for step in range(s * h, (s + 1) * h):
                epoch, first = divmod(step, PER_EPOCH)
                batch = np.random.default_rng([0, epoch]).permutation(1438)[first * 50: first * 50 + 50]
                shard = np.array_split(batch, n)[r]
                model.loss_and_grads(d.train_x[shard], d.train_y[shard], n / len(batch))
                opt.step(model.flat_grads)
            params.append(model.flat_params.copy())
            velocities.append(opt.velocity.copy())
        delta = sum(anchor - p for p in params) / n
        velocity = sum(velocities) / n
        outer = outer * outer_m + delta
        anchor = anchor - outer_lr * (delta + outer_m * outer)
    return anchor, velocity, outer


@pytest.mark.parametrize("n", [2, 3])
def test_the_diloco_outer_step_is_the_reference_arithmetic(tmp_path, n):
    """Two syncs of H = 3 (--max-steps 6: a checkpoint of step 6), against ``reference_diloco``: the
    same bits on 2 ranks (a sum of two is the same in any order); on 3, the ring adds each chunk in
    its own order (within 1e-12)."""
    directory, out, _ = train(n, tmp_path, "d", "--strategy", "diloco", "--sync-every", "3", "--max-steps", "6")
    assert "stopped at step 6 (--max-steps)" in out and "back at" not in out, out[-2000:]
    assert "nothing to do" not in out, out[-2000:]   # (epochs remain: the stop came inside the first)
    saved = newest(directory)
    assert int(saved["step"]) == 6
    for name, expected in zip(("params", "velocity", "outer_momentum"), reference_diloco(n, 3, 2)):
        if n == 2:
            np.testing.assert_array_equal(saved[name], expected, err_msg=name)
        else:
            np.testing.assert_allclose(saved[name], expected, rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("strategy", [["--strategy", "local-sgd", "--sync-every", "5"],
                                      ["--strategy", "diloco", "--sync-every", "5"]], ids=["local-sgd", "diloco"])
def test_a_resumed_run_ends_with_the_bits_of_an_uninterrupted_one(tmp_path, strategy):
    """From an epoch's checkpoint, and from a stop between two syncs (--max-steps 37: the replicas
    go back to step 34 (29 + 5), the last sync, whose checkpoint the resumed run replays from), on 2 ranks
    then on 3 (a sync point is the whole state: any number of ranks resumes it)."""
    _, _, straight = train(2, tmp_path, "straight", *strategy, "--epochs", "3")
    train(2, tmp_path, "epoch", *strategy, "--epochs", "1")
    _, log, resumed = train(2, tmp_path, "epoch", *strategy, "--epochs", "3", "--resume")
    assert "resuming from" in log and resumed == straight
    directory, log, _ = train(2, tmp_path, "inside", *strategy, "--max-steps", "37")
    assert "stopped at step 37 (--max-steps); back at the last sync, step 34" in log, log[-2000:]
    assert (directory / "checkpoint-epoch000001_step000000034.npz").exists()
    _, log, resumed = train(2, tmp_path, "inside", *strategy, "--epochs", "3", "--resume")
    assert "epoch 1 done, step 34" in log and resumed == straight, log[-2000:]
    _, log, _ = train(3, tmp_path, "inside", *strategy, "--epochs", "4", "--resume")   # (train: identical replicas)
    assert "resuming from" in log and "with 3 rank(s)" in log and "epoch   4/4" in log, log[-2000:]


def test_a_preempted_diloco_run_resumes_from_its_last_sync(tmp_path):
    """SIGTERM to one rank between two syncs: every rank stops at one step, rank 0 writes the last
    sync (named in the line), exit 143; --resume ends with the digest of a run never preempted."""
    directory = tmp_path / "ckpt"
    flags = ["--dtype", "float64", "--batch-size", "50", "--hidden", "16", "--strategy", "diloco",
             "--sync-every", "7", "--checkpoint-dir", str(directory)]
    process = start(2, ["--epochs", "5000", *flags])
    output = read_until(process, "epoch   2/")
    pids = output.split("ranks (pid): ", 1)[1].split("  (", 1)[0]
    os.kill(int(pids.split(", ")[1].split("(")[1].rstrip(")")), signal.SIGTERM)
    output += finish(process)
    assert process.returncode == 143, output[-3000:]
    # the last sync: inside an epoch (a step checkpoint), or at an epoch's end (that epoch's checkpoint)
    found = re.search(r"the last checkpoint is (?:step (\d+) \(inside epoch (\d+), the last sync\)|epoch (\d+))",
                      output)
    assert found, output[-3000:]
    if found.group(3) is None:
        step, epoch = int(found.group(1)), int(found.group(2))
        assert step % PER_EPOCH % 7 == 0 and (directory / f"checkpoint-epoch{epoch - 1:06d}_step{step:09d}.npz").exists()
    else:
        epoch = int(found.group(3)) + 1
        assert (directory / f"checkpoint-epoch{epoch - 1:06d}.npz").exists(), output[-3000:]
    epochs = ["--epochs", str(epoch + 1)]
    last = run_world(2, ["-m", "trainer", *flags, *epochs, "--resume"], TIMEOUT_S)
    never = run_world(2, ["-m", "trainer", *flags[:-2], *epochs], TIMEOUT_S)
    assert last.returncode == 0 and never.returncode == 0, last.stdout[-3000:] + never.stdout[-3000:]
    assert DIGEST.search(last.stdout).group(1) == DIGEST.search(never.stdout).group(1)


@pytest.mark.parametrize("flags, message", [
    (["--strategy", "local-sgd", "--sync-every", "0"], "--sync-every: must be >= 1, got 0"),
    (["--strategy", "diloco", "--outer-momentum", "1"], "--outer-momentum: must be in [0, 1), got 1"),
    (["--strategy", "diloco", "--outer-momentum", "-0.5"], "--outer-momentum: must be in [0, 1), got -0.5"),
    (["--strategy", "diloco", "--outer-lr", "0"], "--outer-lr: must be > 0, got 0"),
    (["--strategy", "diloco", "--outer-lr", "nan"], "--outer-lr: must be a finite number, got nan"),
    (["--sync-every", "4"], "--sync-every: only for --strategy local-sgd or diloco"),
    (["--strategy", "local-sgd", "--outer-lr", "0.5"], "--outer-lr: only for --strategy diloco"),
    (["--strategy", "diloco", "--servers", "1"], "--servers: only for --strategy ps"),
    (["--strategy", "ps", "--compression", "bf16"], "--compression bf16: only for --strategy allreduce or diloco"),
    (["--strategy", "local-sgd", "--compression", "fp16"], "--compression fp16: only for --strategy allreduce or "
                                                           "diloco"),
    (["--compression", "zstd"], "invalid choice: 'zstd'"),
    (["--strategy", "diloco", "--elastic", "--commit-every", "2"], "--commit-every: not with --strategy diloco"),
    (["--strategy", "ps", "--max-steps", "3"], "--max-steps: not with --strategy ps"),
])
def test_bad_values_are_refused_naming_the_flag(flags, message):
    result = run_world(2, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "Traceback" not in result.stdout and "training [" not in result.stdout, result.stdout


def test_error_feedback_delays_rounding_and_loses_nothing():
    """One process, 200 steps of random gradients through ErrorFeedback: what was sent plus what
    is still held is what came in (up to float32's own rounding of the sums), every residual
    within half a unit of the wire type's last place, and what was sent exactly representable on
    the wire (the ring's codec would carry it unchanged)."""
    rng = np.random.default_rng(1)
    for codec, digits in (("bf16", 8), ("fp16", 11)):
        fb = compression.ErrorFeedback(np.zeros(1000, np.float32), codec)
        came, sent = np.zeros(1000), np.zeros(1000)
        for _ in range(200):
            g = (rng.standard_normal(1000) * 10.0 ** rng.integers(-3, 2)).astype(np.float32)
            came += g
            before = g + fb.residual
            fb.contribute(g)
            sent += g
            assert np.array_equal(compression.wire_roundtrip(g, codec), g)
            assert np.all(np.abs(fb.residual) <= np.abs(before) * 2.0 ** -digits + 2.0 ** -24)
        np.testing.assert_allclose(sent + fb.residual, came, rtol=1e-5, atol=1e-4, err_msg=codec)


def test_the_trainers_round_trip_is_the_wires_but_saturates_past_float16():
    """trainer/compression.py rounds with the ring's own codec (``col.round_to_wire``), but past
    float16's range saturates where the wire gives inf (the excess waits in the residual)."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-8, 8, 10000),
                        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 0.0, -0.0, 6e4])]).astype(np.float32)
    for codec in compression.CODECS:
        wire = col.round_to_wire(x, codec)
        ours = compression.wire_roundtrip(x, codec)
        inside = np.isfinite(wire)
        assert np.array_equal(ours[inside].view(np.uint32), wire[inside].view(np.uint32)), codec
        assert np.array_equal(ours[~inside], np.sign(x[~inside]) * 65504.0) and (codec == "fp16" or inside.all())
        assert codec == "bf16" or not inside.all()   # (the sample does reach past float16's range)


@pytest.mark.parametrize("n", [2, 3])
def test_compressed_runs_end_identical_and_resume_bit_for_bit(tmp_path, n):
    """--compression bf16 (all-reduce, overlapped buckets) and fp16 (DiLoCo's deltas): identical replicas;
    the residuals are each rank's, in the checkpoint: a resume on as many ranks is bit for bit."""
    for flags in (["--compression", "bf16", "--bucket-mb", "0.001", "--dtype", "float32"],
                  ["--strategy", "diloco", "--sync-every", "4", "--compression", "fp16"]):
        name = flags[flags.index("--compression") + 1]
        _, _, straight = train(n, tmp_path, f"{name}-straight", *flags, "--epochs", "3")
        directory, _, _ = train(n, tmp_path, f"{name}-resumed", *flags, "--epochs", "1")
        assert newest(directory)["residual_sizes"].tolist() == [newest(directory)["params"].size] * n
        _, _, resumed = train(n, tmp_path, f"{name}-resumed", *flags, "--epochs", "3", "--resume")
        assert resumed == straight, flags


def test_elastic_diloco_survivors_go_on_from_the_last_sync(tmp_path):
    """``--strategy diloco --elastic`` at n = 4: rank 2's process (by the pid the trainer prints) is
    SIGKILLed during epoch 2; the survivors go back to the last commit, a sync (step % 23 % 5 == 0:
    the digits' 23 steps an epoch), and end with the bits of 4 ranks to that step then 3 resumed."""
    train_flags = ["-m", "trainer", "--epochs", "5", "--dtype", "float64", "--strategy", "diloco",
                   "--sync-every", "5"]
    out, status = trainer_killing(train_flags, "epoch   2/", 2)
    found = re.search(r"elastic: rank 2 gone: 4 -> 3 ranks; back to step (\d+)", out)
    assert status == 0 and found and "done: " in out, out[-3000:]
    step = int(found.group(1))
    assert step % 23 % 5 == 0, out[-3000:]
    ends_as_a_restart(out, train_flags, 4, step, 3, tmp_path)
