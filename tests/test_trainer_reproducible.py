"""Tier 2, issue 62: ``python -m trainer --reproducible``. Each global batch is cut into a fixed number of
virtual shards (``--shards``), dealt to the ranks; each shard's gradient is a contribution of the
reproducible all-reduce (the exact sum, rounded once). The final parameters' digest is then one
at every world size, and after an elastic run lost a rank. Every run is bounded (``run_world``)."""
import functools
import re

import pytest

from tests.support.trainer import trainer_killing
from tests.worlds import run_world


BOUND_S = 240   # (6 ranks on 2 cores: about 30 s here)
TRAIN = ["-m", "trainer", "--reproducible", "--epochs", "2"]   # float32, the default: the hardest dtype


def digest(out: str) -> str:
    found = re.search(r"parameters identical on every rank \(blake2b (\w+)\)", out)
    assert found, out[-3000:]
    return found.group(1)


@functools.lru_cache(maxsize=None)
def calm(n: int, *flags: str) -> str:
    """The digest of ``TRAIN`` (and ``flags``) at ``n`` ranks, run once per session."""
    result = run_world(n, [*TRAIN, *flags], BOUND_S)
    assert result.returncode == 0, result.stdout[-4000:]
    return digest(result.stdout)


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_every_world_size_ends_with_the_digest_of_one_rank(n):
    assert calm(n) == calm(1)


def test_without_the_flag_the_digest_depends_on_the_world_size():
    """The check above could fail: the plain all-reduce adds 3 ranks' gradients in another order."""
    plain = [run_world(n, ["-m", "trainer", "--epochs", "2"], BOUND_S) for n in (1, 3)]
    assert all(r.returncode == 0 for r in plain), plain[1].stdout[-3000:]
    assert digest(plain[0].stdout) != digest(plain[1].stdout)


def test_other_shards_and_float64_are_reproducible_too():
    flags = ("--shards", "4", "--dtype", "float64", "--batch-size", "50")
    assert calm(4, *flags) == calm(1, *flags) == calm(2, *flags)


def test_a_world_size_the_shards_do_not_divide_is_refused():
    result = run_world(3, ["-m", "trainer", "--reproducible", "--shards", "8"], BOUND_S)
    assert result.returncode == 2, result.stdout[-3000:]
    assert ("error: --shards 8: 3 rank(s) cannot take equal parts of the 8 virtual shards of each batch "
            "(--reproducible); run on 1, 2, 4 or 8 rank(s), or give --shards a multiple of 3") in result.stdout, \
        result.stdout[-3000:]


@pytest.mark.parametrize("flags, message", [
    (["--strategy", "local-sgd"], "--reproducible: not with --strategy local-sgd"),
    (["--strategy", "diloco"], "--reproducible: not with --strategy diloco"),
    (["--compression", "bf16"], "--reproducible: not with --compression bf16"),
    (["--shards", "4"], None),
])
def test_what_reproducible_does_not_go_with_is_refused_by_name(flags, message):
    if message is None:   # --shards alone
        flags, message = flags, "--shards: only with --reproducible"
    else:
        flags = ["--reproducible", *flags]
    result = run_world(1, ["-m", "trainer", *flags], BOUND_S)
    assert result.returncode == 2 and message in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("shards", ["12", "8"])
def test_an_elastic_run_that_loses_a_rank_ends_with_the_calm_digest(shards):
    """A reproducible ``--elastic`` run at 4 ranks whose rank 2 is SIGKILLed during epoch 2 goes on
    with 3 (the shards dealt again: 8 unequally) and ends with the digest of the calm run, at any
    world size."""
    flags = ("--epochs", "4", "--shards", shards)
    out, status = trainer_killing([*TRAIN, *flags], "epoch   1/", 2)
    assert status == 0 and re.search(r"elastic: rank 2 gone: 4 -> 3 ranks; back to step \d+", out), out[-3000:]
    assert ("3 rank(s) take unequal parts of the 8 shards" in out) == (shards == "8"), out[-3000:]
    assert digest(out) == calm(2, *flags), out[-3000:]


def test_a_run_stopped_inside_an_epoch_and_resumed_on_other_ranks_ends_with_the_calm_digest(tmp_path):
    directory = str(tmp_path / "ckpt")
    first = run_world(2, [*TRAIN, "--max-steps", "30", "--checkpoint-dir", directory], BOUND_S)
    second = run_world(3, [*TRAIN, "--checkpoint-dir", directory, "--resume"], BOUND_S)
    assert first.returncode == 0 and second.returncode == 0, (first.stdout[-2000:], second.stdout[-2000:])
    assert "(epoch 1 done, step 30)" in second.stdout and digest(second.stdout) == calm(1), second.stdout[-3000:]
