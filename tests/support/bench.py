"""The bench run as users run it (``mpiexec -n N python -m bench``), on a quick sweep, and the rows
of its JSON report."""
import json

from tests.worlds import run_world

TIMEOUT_S = 240
#: (--no-gloo: the gloo column has its own tests, in test_bench_gloo.py; these stay quick without torch's start)
QUICK = ["--max-bytes", "64K", "--factor", "16", "--iters", "5", "--warmup", "1", "--no-gloo"]


def bench(n, *flags, timeout=TIMEOUT_S, env=None):
    """``mpiexec -n n python -m bench QUICK FLAGS``, bounded by ``timeout`` seconds."""
    return run_world(n, ["-m", "bench", *QUICK, *flags], timeout, env=env)


def rows_of(path):
    """The environment and the rows of the bench's JSON report at ``path``."""
    report = json.loads(path.read_text())
    return report["environment"], report["rows"]
