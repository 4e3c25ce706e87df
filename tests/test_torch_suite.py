"""Tier 2: PyTorch's own distributed tests (``DistributedTest._DistTestBase``, from the torch wheel) on the
"ring" backend, against the same tests run the same way on gloo, at n=2: every test that passes on
gloo must pass on ring, but for the EXCEPTIONS below (torch itself ties them to gloo by name).

One pytest test per torch test, each run in fresh worlds (``tests/torch_suite.py``: one world per
test and backend, its ranks forked from a zygote that imported torch once, each world killed after
BOUND_S): passed where ring passes (gloo is then not run); where ring does not, gloo runs, and the
test is skipped where torch's gating (evaluated as for gloo) or gloo's own run does not pass, the
reason saying which; an exception that fails on ring is an xfail naming torch's line and ring's
error; any other failure shows ring's error and the tail of its output. The same as a table::

    python scripts/torch_suite.py -n 2 --backend both
"""
from __future__ import annotations

import atexit
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py")
pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (the 'test' extra installs it)")

from tests.torch_suite import Outcome, Zygote, exception_line, judge, run_test  # noqa: E402

N = 2
BOUND_S = 60          # per world (the slowest test here takes under 12 s at n=2): a slow machine is let be slow

# Tests that cannot pass on ring because torch ties them to gloo by name (the suite's gating is
# evaluated as for gloo, so ring is offered them). Each names the torch source line.
TORCH = "torch/testing/_internal/distributed/distributed_test.py"
C10D = "torch/distributed/distributed_c10d.py"
EXCEPTIONS = {
    # backend_str = BACKEND.lower(); self.assertEqual(dist.get_backend(), backend_str): the test compares
    # the default group's backend name with the suite's BACKEND, which is "gloo" for the gating.
    "test_get_backend": f"{TORCH}:776-777 asserts dist.get_backend() == BACKEND (gloo)",
    # if get_backend(group) != Backend.GLOO: raise ValueError("monitored_barrier is only implemented for
    # GLOO backend."): dist.monitored_barrier refuses every other backend before reaching it.
    "test_monitored_barrier_gloo": f"{C10D}:5418-5419 dist.monitored_barrier accepts only gloo",
    "test_monitored_barrier_gloo_subgroup": f"{C10D}:5418-5419 dist.monitored_barrier accepts only gloo",
}

# Tests that read the backend's name at run time and pass on ring while checking less than on gloo
# (distributed_test.py): the send/recv profiler events (:1641, :1710, :1791, :1880, :1940, for the backends
# in SEND_RECV_PROFILING_SUPPORTED_BACKENDS), the collectives' profiler events (:2619), DDP's logged
# gloo_socket_ifname (:6308). And by type, not name (distributed_c10d.py:2278-2280): a backend whose
# creator returns a ProcessGroup, as ring's does, is not wrapped in the ProcessGroupWrapper that
# TORCH_DISTRIBUTED_DEBUG=DETAIL adds to gloo, so the DETAIL runs of with_dist_debug_levels check less.

_zygote = Zygote(N)                     # (at collection: its catalogue names the tests)
atexit.register(_zygote.close)
CATALOGUE = _zygote.catalogue


@pytest.fixture(scope="module", autouse=True)
def _zygote_ends_with_the_module():
    yield
    _zygote.close()


def _run(backend: str, test: dict) -> Outcome:
    return run_test(N, backend, test, CATALOGUE["skips"], BOUND_S, _zygote)


@pytest.mark.parametrize("test", CATALOGUE["tests"], ids=lambda t: t["name"])
def test_ring_passes_what_gloo_passes(test):
    name = test["name"]
    if test["skip"] is not None:
        pytest.skip(f"torch's gating (as for gloo): {test['skip']}")
    ring = _run("ring", test)
    if ring.status == "PASS":
        return   # (whatever gloo does: the promise holds, and gloo's run, half the tier's time, is not needed)
    gloo = _run("gloo", test)
    if gloo.status != "PASS":
        pytest.skip(f"gloo, the reference, does not pass: {gloo.status} {gloo.reason}; ring: {ring.status}")
    if name in EXCEPTIONS:
        pytest.xfail(f"{EXCEPTIONS[name]}; ring: {ring.reason}")
    pytest.fail(f"passes on gloo ({gloo.seconds:.1f} s), {ring.status} on ring ({ring.seconds:.1f} s): {ring.reason}\n"
                f"--- the tail of ring's output ---\n{ring.tail(40)}", pytrace=False)


def test_every_exception_is_a_test_of_the_suite():
    assert set(EXCEPTIONS) <= {t["name"] for t in CATALOGUE["tests"]}


# The harness itself: how exit codes read (as MultiProcessTestCase._check_return_codes reads them),
# and a world past its bound.

SKIPS = CATALOGUE["skips"]


def _result(rank, code, error=""):
    return {"rank": rank, "code": code, "error": error, "skip_reason": ""}


ASSERTION = "Traceback (most recent call last):\n  File x\nAssertionError: 1 != 2\n\nTo execute this test, run ..."
BARRIER = "Traceback (most recent call last):\n  File x\nRuntimeError: barrier timeout"


@pytest.mark.parametrize("results, returncode, status, reason", [
    ({0: _result(0, 0), 1: _result(1, 0)}, 0, "PASS", ""),
    ({0: _result(0, 0), 1: _result(1, 10, ASSERTION)}, 10, "FAIL", "rank 1: AssertionError: 1 != 2"),
    ({0: _result(0, 75), 1: _result(1, 75)}, 75, "SKIP", "Need at least 1 CUDA device"),
    ({0: _result(0, 0)}, -9, "FAIL", "hung"),                         # killed at the bound
    ({0: _result(0, 0), 1: _result(1, 1, BARRIER)}, 1, "FAIL", "rank 1 exited 1: RuntimeError: barrier timeout"),
    ({1: _result(1, 1, BARRIER)}, 1, "FAIL", "rank(s) [0] still in the test"),
    ({0: _result(0, 0)}, 137, "FAIL", "without a result"),
])
def test_exit_codes_read_as_torch_reads_them(results, returncode, status, reason):
    outcome = judge("test_x", "ring", 2, results, returncode, "output", 1.0, SKIPS)
    assert (outcome.status, reason in outcome.reason) == (status, True), outcome


def test_the_exception_line_is_the_last_tracebacks():
    text = ("Traceback (most recent call last):\n  File a\nKeyError: 1\n\nDuring handling of the above exception, "
            "another exception occurred:\n\nTraceback (most recent call last):\n  File b\n    x()\n"
            "ValueError: monitored_barrier is only implemented for GLOO backend.\n\nTo execute this test, run ...")
    assert exception_line(text) == "ValueError: monitored_barrier is only implemented for GLOO backend."


def test_a_world_past_its_bound_fails_and_leaves_no_process_behind():
    test = next(t for t in CATALOGUE["tests"] if t["name"] == "test_all_reduce_sum")
    began = time.monotonic()
    outcome = run_test(N, "ring", test, SKIPS, 3.0, _zygote, env={"TORCH_SUITE_PLANT_HANG": "1"})   # rank 1 hangs
    assert outcome.status == "FAIL" and "hung" in outcome.reason and "no result from rank(s)" in outcome.reason, \
        outcome.line()
    assert time.monotonic() - began < 3.0 + 10, outcome.line()
    deadline = time.monotonic() + 10
    while _children(_zygote.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _children(_zygote.process.pid), "the zygote's children outlived their killed world"


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in found if Path(f"/proc/{c}").exists() and "Z" not in _state(c)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"

