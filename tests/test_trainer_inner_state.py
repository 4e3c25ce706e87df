"""Tier 2, issue 58 item 9: ``--inner-state averaged|local`` for local SGD and DiLoCo: what a sync sends
(counted by wrapping the all-reduces a sync makes), replicas identical after a sync with local
momentum, and what a checkpoint of local momentum gives back on as many and on another number of
ranks (trainer/strategies/periodic.py)."""
import json

import numpy as np
import pytest

#: One sync, by a program of its own: each rank takes 3 inner steps on a batch of its own, then the
#: strategy's sync runs with col.allreduce and col.allreduce_many wrapped to count the bytes handed
#: to them. Prints (rank 0) every rank's bytes and the digests of its parameters and momentum.

from tests.support.strategies import PER_EPOCH, TIMEOUT_S, newest, train
from tests.worlds import run_world


ONE_SYNC = """
import hashlib, json, sys
import numpy as np
import collectives as col
from trainer.model import MLP
from trainer.optim import SGD
from trainer.strategies.diloco import DiLoCo
from trainer.strategies.local_sgd import LocalSGD

strategy, inner_state, compression = sys.argv[1:4]
model = MLP([8, 16, 4], np.random.default_rng(0), np.float32)
opt = SGD(model.flat_params, 0.05, 0.9, 1e-4)
periodic = LocalSGD(model, opt, 3, 10, inner_state) if strategy == "local-sgd" else \\
    DiLoCo(model, opt, 3, 10, compression=compression, inner_state=inner_state)
sent = []
allreduce, allreduce_many = col.allreduce, col.allreduce_many
def counted(x, *a, **k):
    sent.append(int(x.nbytes))
    return allreduce(x, *a, **k)
def counted_many(xs, *a, **k):
    sent.extend(int(x.nbytes) for x in xs)
    return allreduce_many(xs, *a, **k)
col.allreduce, col.allreduce_many = counted, counted_many
data = np.random.default_rng(col.rank() + 1)
for _ in range(3):
    periodic.local_step(model, opt, data.standard_normal((5, 8)).astype(np.float32), data.integers(0, 4, 5), 0.1)
periodic.sync(model, opt, 3, None)
col.allreduce, col.allreduce_many = allreduce, allreduce_many
digest = lambda a: hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest()
every = col.allgather(np.frombuffer(json.dumps([sent, digest(model.flat_params), digest(opt.velocity)]).ljust(200)
                                    .encode(), np.uint8)[None, :])
if col.rank() == 0:
    print("RESULT " + json.dumps([json.loads(bytes(row).decode()) for row in every]))
    print("PARAMETER BYTES", model.flat_params.nbytes)
"""


def one_sync(strategy, inner_state, compression="none", n=2):
    """Every rank's (bytes handed to all-reduces, parameters' digest, momentum's digest) after one
    sync, and the parameters' size in bytes."""
    result = run_world(n, ["-c", ONE_SYNC, strategy, inner_state, compression], TIMEOUT_S)
    assert result.returncode == 0 and "RESULT " in result.stdout, result.stdout[-3000:]
    ranks = json.loads(result.stdout.split("RESULT ", 1)[1].splitlines()[0])
    return ranks, int(result.stdout.split("PARAMETER BYTES ", 1)[1].split()[0])


@pytest.mark.parametrize("strategy, compression", [("local-sgd", "none"), ("diloco", "none"), ("diloco", "bf16")])
def test_local_inner_state_halves_what_a_sync_sends_and_the_replicas_still_meet(strategy, compression):
    """averaged: the parameters (or delta) and the momentum; local: the parameters (or delta) alone,
    half the bytes (with bf16 counted before the codec halves the delta again). Either way every
    rank ends the sync with the same parameters; with local the momenta stay the replicas' own."""
    averaged, size = one_sync(strategy, "averaged", compression)
    local, _ = one_sync(strategy, "local", compression)
    assert [sent for sent, _, _ in averaged] == [[size, size]] * 2, averaged
    assert [sent for sent, _, _ in local] == [[size]] * 2, local
    for ranks in (averaged, local):
        assert len({params for _, params, _ in ranks}) == 1, ranks
    assert len({velocity for _, _, velocity in averaged}) == 1, averaged
    assert len({velocity for _, _, velocity in local}) == 2, "the momenta were made the same: not local"


LOCAL = ["--strategy", "diloco", "--sync-every", "5", "--inner-state", "local"]


def test_a_local_inner_state_checkpoint_resumes_bit_for_bit_on_as_many_ranks(tmp_path):
    """The checkpoint holds each rank's momentum (rows that differ); a resume on 2 ranks from an
    epoch, and from a stop between syncs (--max-steps 37: back to step 34), ends with the digest
    of the uninterrupted run; averaged momentum trains another model (the flag is not ignored)."""
    straight, _, digest = train(2, tmp_path, "straight", *LOCAL, "--epochs", "3")
    _, _, averaged = train(2, tmp_path, "averaged", *LOCAL[:-2], "--epochs", "3")
    assert averaged != digest
    directory, _, _ = train(2, tmp_path, "epoch", *LOCAL, "--epochs", "1")
    rows = newest(directory)["inner_velocities"]
    assert rows.shape == (2, newest(directory)["params"].size) and not np.array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(newest(directory)["velocity"], rows[0])
    _, log, resumed = train(2, tmp_path, "epoch", *LOCAL, "--epochs", "3", "--resume")
    assert "resuming from" in log and "their average" not in log and resumed == digest, log[-2000:]
    np.testing.assert_array_equal(newest(tmp_path / "epoch")["inner_velocities"], newest(straight)["inner_velocities"])
    directory, log, _ = train(2, tmp_path, "inside", *LOCAL, "--max-steps", "37")
    assert f"back at the last sync, step {PER_EPOCH + 5}" in log, log[-2000:]
    _, log, resumed = train(2, tmp_path, "inside", *LOCAL, "--epochs", "3", "--resume")
    assert "epoch 1 done, step 34" in log and resumed == digest, log[-2000:]


def test_a_local_inner_state_checkpoint_on_another_number_of_ranks_starts_from_the_average(tmp_path):
    """On 3 ranks (and with --inner-state averaged, --resume-changed) every rank starts from the
    average of the checkpoint's momenta (the arithmetic: ``trainer.resuming.inner_momentum``'s
    doctest), and rank 0 says so once; changing --inner-state without --resume-changed is refused,
    naming both."""
    directory, _, _ = train(2, tmp_path, "two", *LOCAL, "--epochs", "1")
    _, log, _ = train(3, tmp_path, "two", *LOCAL, "--epochs", "2", "--resume")
    assert log.count("--resume: checkpoint-epoch000001.npz holds the inner momentum of each of its 2 rank(s) "
                     "(--inner-state local); on 3 rank(s) every rank starts from their average") == 1, log[-2000:]
    refused = run_world(2, ["-m", "trainer", "--epochs", "3", "--dtype", "float64", "--batch-size", "50",
                            "--hidden", "16", "--checkpoint-dir", str(directory), *LOCAL[:-2], "--resume"], TIMEOUT_S)
    assert refused.returncode == 2 and refused.stdout.count("--inner-state local -> averaged") == 1, refused.stdout
    _, log, _ = train(2, tmp_path, "two", *LOCAL[:-2], "--epochs", "3", "--resume", "--resume-changed")
    assert "this run shares one momentum: every rank starts from their average" in log, log[-2000:]


@pytest.mark.parametrize("flags, message", [
    (["--strategy", "diloco", "--inner-state", "local", "--elastic"],
     "--inner-state local: not with --elastic: a change hands every rank rank 0's state"),
    (["--strategy", "local-sgd", "--inner-state", "local", "--tensor-parallel", "2"],
     "--inner-state local: not with --tensor-parallel 2"),
    (["--inner-state", "local"], "--inner-state: only for --strategy local-sgd or diloco"),
    (["--strategy", "diloco", "--inner-state", "paper"], "invalid choice: 'paper'"),
])
def test_what_local_inner_state_cannot_keep_is_refused_in_one_line(flags, message):
    result = run_world(2, ["-m", "trainer", *flags], 60)
    assert result.returncode == 2 and result.stdout.count(message) == 1, result.stdout
    assert "Traceback" not in result.stdout and "training [" not in result.stdout, result.stdout
