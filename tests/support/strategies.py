"""The trainer's strategies (``--strategy``, ``--compression``) run as users run them: a small run
to its end with the digest of its replicas, and its newest checkpoint."""
import re

from tests.worlds import run_world
from trainer import checkpoint

TIMEOUT_S = 180
SMALL = ["--epochs", "2", "--dtype", "float64", "--batch-size", "50", "--hidden", "16"]   # 29 steps an epoch
PER_EPOCH = -(-1438 // 50)
DIGEST = re.compile(r"parameters identical on every rank \(blake2b (\w+)\)")


def train(n, tmp_path, name, *flags, ok=True):
    """``mpiexec -n n python -m trainer SMALL --checkpoint-dir tmp_path/name FLAGS``: its directory,
    output and digest (the run must end with identical replicas)."""
    directory = tmp_path / name
    result = run_world(n, ["-m", "trainer", *SMALL, "--checkpoint-dir", str(directory), *flags], TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:]
    found = DIGEST.search(result.stdout)
    assert found, result.stdout[-4000:]
    return directory, result.stdout, found.group(1)


def newest(directory):
    """What the newest valid checkpoint in ``directory`` holds."""
    return checkpoint.newest_valid(directory)[1]
