"""Tier 1: a done-callback holds its call's turn, so the calls it issues come right after that call,
whatever another thread queued meanwhile (PowerSGD with several DDP buckets: a bucket's callbacks
all-reduce P and Q while backward issues the next bucket's all-reduce). Without MPI; jobs record
which thread ran them and in what order, and gates (not sleeps) decide what is running when."""
import threading
import time

import pytest

from collectives.calls import progress

pytestmark = [pytest.mark.quick, pytest.mark.timeout(20)]   # (no MPI: fast; a deadlock fails)


class _Runtime:
    """What the engine needs of collectives.process.runtime.Runtime."""

    def __init__(self):
        self.failure = None
        self.world = None

    def stop(self, failure, error=None, by_peer=False):
        self.failure = self.failure or failure
        return self.failure


class _Call:
    seq, algorithm = 1, ""


def _job(log, name, gate=None):
    def run():
        if gate is not None:
            assert gate.wait(10), "the gate never opened"
        log.append((name, threading.get_ident()))
        return name, _Call
    return run


def _until(condition, seconds: float = 30.0) -> bool:
    give_up = time.monotonic() + seconds
    while not condition() and time.monotonic() < give_up:
        time.sleep(0.01)
    return condition()


def test_calls_a_callback_issues_come_before_calls_queued_while_its_call_ran():
    engine, log = progress.Engine(_Runtime(), threaded=True), []
    gate = threading.Event()
    first = engine.submit(progress.Work("allreduce", _job(log, "U0", gate), engine))
    issued = {}

    def continuation(work):   # (PowerSGD: all-reduce P, wait for it; then Q)
        issued["P0"] = engine.submit(progress.Work("allreduce", _job(log, "P0"), engine))
        assert issued["P0"].wait() == "P0"
        assert engine.run_now(_job(log, "Q0"))[0] == "Q0"
    first.add_done_callback(continuation)
    assert _until(lambda: first.started_at is not None), "the engine thread never took U0"
    second = engine.submit(progress.Work("allreduce", _job(log, "U1"), engine))   # (queued while U0 runs)
    gate.set()
    assert second.wait() == "U1"
    assert [name for name, _ in log] == ["U0", "P0", "Q0", "U1"]
    engine_thread = log[0][1]
    assert [thread for _, thread in log[:3]] == [engine_thread] * 3, "a callback's calls run in its thread"


def test_a_callback_attached_after_the_call_is_done_runs_in_the_attaching_thread_in_issue_order():
    engine, log = progress.Engine(_Runtime(), threaded=True), []
    first = engine.submit(progress.Work("allreduce", _job(log, "U0"), engine))
    first.wait()
    queued = engine.submit(progress.Work("allreduce", _job(log, "U1"), engine))
    first.add_done_callback(lambda _: engine.run_now(_job(log, "P0")))   # (not in U0's turn: after U1)
    queued.wait()
    assert [name for name, _ in log] == ["U0", "U1", "P0"]
    assert log[2][1] == threading.get_ident()
