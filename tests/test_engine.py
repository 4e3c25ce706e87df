"""Tier 1, issue 24: the progress engine's queue without MPI. Calls run one at a time in issue order;
a thread that waits for a handle, or makes a blocking call behind queued async calls, runs them
itself (no hand-off to the engine thread); a bounded wait leaves the call to the engine thread;
the engine thread still runs what nobody waits for. Jobs record which thread ran them; nothing
here depends on how fast this machine is (the waits are generous bounds, never measured)."""
import threading
import time

import pytest

from collectives.calls import progress
from collectives.errors import CollectiveUsageError

pytestmark = pytest.mark.quick   # (the progress engine's queue, no MPI: fast)


class _Runtime:
    """What the engine needs of collectives.calls.runtime.Runtime."""

    def __init__(self):
        self.failure = None
        self.world = None
        self.retired = None   # (the world a change replaced: none here)

    def stop(self, failure, error=None, by_peer=False):
        self.failure = self.failure or failure
        return self.failure


class _Call:
    """What a job returns with its result (collectives.calls.call.Call): its number and algorithm."""
    seq, algorithm = 1, ""


def _engine():
    return progress.Engine(_Runtime(), threaded=True)


@pytest.fixture
def patient_engine_thread(monkeypatch):
    """The engine thread takes no call younger than a minute: what a caller runs is the caller's."""
    monkeypatch.setattr(progress, "_PICKUP_SECONDS", 60.0)


def _job(log, name, gate=None):
    def run():
        if gate is not None:
            assert gate.wait(10), "the gate never opened"
        log.append((name, threading.get_ident()))
        return name, _Call
    return run


def test_a_handle_waited_at_once_runs_in_the_waiting_thread(patient_engine_thread):
    engine, log = _engine(), []
    work = engine.submit(progress.Work("allreduce", _job(log, "a"), engine))
    assert work.wait() == "a" and log == [("a", threading.get_ident())]


def test_a_blocking_call_behind_queued_async_calls_runs_them_first_in_order_in_its_thread(patient_engine_thread):
    engine, log = _engine(), []
    works = [engine.submit(progress.Work("allreduce", _job(log, name), engine)) for name in "abc"]
    assert engine.run_now(_job(log, "blocking"))[0] == "blocking"
    me = threading.get_ident()
    assert log == [("a", me), ("b", me), ("c", me), ("blocking", me)]
    assert [w.wait() for w in works] == ["a", "b", "c"]


def test_waiting_for_a_later_handle_runs_the_earlier_ones_first(patient_engine_thread):
    engine, log = _engine(), []
    works = [engine.submit(progress.Work("allreduce", _job(log, name), engine)) for name in "ab"]
    assert works[1].wait() == "b" and [name for name, _ in log] == ["a", "b"] and works[0].is_completed()


def test_a_bounded_wait_leaves_the_call_to_the_engine_thread():
    engine, log = _engine(), []
    work = engine.submit(progress.Work("allreduce", _job(log, "a"), engine))
    assert work.wait(timeout=30) == "a"
    assert log[0][1] != threading.get_ident(), "a bounded wait must not run the call itself (it could not stop)"


def test_the_engine_thread_runs_what_nobody_waits_for():
    engine, log = _engine(), []
    gate = threading.Event()
    work = engine.submit(progress.Work("allreduce", _job(log, "a", gate), engine))
    gate.set()
    give_up = time.monotonic() + 30
    while not work.is_completed() and time.monotonic() < give_up:
        time.sleep(0.01)
    assert work.is_completed() and log[0][1] != threading.get_ident()


def _until(condition, seconds: float = 30.0) -> bool:
    give_up = time.monotonic() + seconds
    while not condition() and time.monotonic() < give_up:
        time.sleep(0.01)
    return condition()


def test_a_blocking_call_waits_while_the_engine_thread_runs_an_earlier_call():
    engine, log = _engine(), []
    gate = threading.Event()
    first = engine.submit(progress.Work("allreduce", _job(log, "a", gate), engine))
    assert _until(lambda: first.started_at is not None), "the engine thread never took the call"

    def open_once_the_blocking_call_waits():   # (its place queued behind the running call)
        if _until(lambda: any(w.name == "(blocking call)" for w in list(engine._queue))):
            gate.set()

    threading.Thread(target=open_once_the_blocking_call_waits, daemon=True).start()
    assert engine.run_now(_job(log, "blocking"))[0] == "blocking"
    assert [name for name, _ in log] == ["a", "blocking"] and first.wait() == "a"


class _Exclusive:
    """Calls that each hold their turn across a pause (where another thread gets the GIL: not a
    timing) and note any other call running meanwhile; ``log``: the calls that ran, in order."""

    def __init__(self, pause: float):
        self.pause, self.log, self.running, self.overlaps = pause, [], [], []

    def call(self, name: str):
        def run():
            self.running.append(name)
            if len(self.running) > 1:
                self.overlaps.append(tuple(self.running))
            time.sleep(self.pause)
            self.running.remove(name)
            self.log.append(name)
            return name, _Call
        return run

    def from_threads(self, callers: dict, calls_each: int) -> None:
        """Run each of ``callers`` (the first letter of its calls' names -> a function making
        ``calls_each`` calls) in a thread of its own. Every thread must end, none raise, no two
        calls overlap, and each thread's calls run once, in the order it made them."""
        errors = []

        def guarded(target):
            try:
                target()
            except BaseException as error:   # noqa: BLE001 - reported by the test, not lost in a thread
                errors.append(error)
        threads = [threading.Thread(target=guarded, args=(target,)) for target in callers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert not any(t.is_alive() for t in threads), "a call never got its turn"
        assert not errors, errors
        assert not self.overlaps, f"calls ran at once, in each other's turn: {self.overlaps[:5]}"
        for k in callers:
            assert [name for name in self.log if name[0] == k] == [f"{k}{i}" for i in range(calls_each)]


def test_two_threads_blocking_calls_never_run_each_others_turn():
    """Each call holds its turn across a pause (where the other thread gets the GIL), and checks that
    no other call is running meanwhile: without the engine's turn, the two threads' calls overlap."""
    engine, calls = _engine(), _Exclusive(0.001)

    def caller(k):
        for i in range(100):
            engine.run_now(calls.call(f"{k}{i}"))

    calls.from_threads({k: lambda k=k: caller(k) for k in "xy"}, 100)


@pytest.mark.timeout(60)   # (a lost turn deadlocks)
def test_the_lanes_turn_taken_without_the_lock_never_overlaps_blocking_or_async_calls():
    """The express lane takes the turn without the engine's lock (``Engine.take``, one ``setdefault``), so
    it races the threads that take it under the lock: a blocking caller's, and the async calls a
    thread queues and the engine thread or its waiter runs. Each call holds its turn across a pause
    and checks that no other runs; every call runs once, and no turn is lost (a hang)."""
    engine, calls, each = _engine(), _Exclusive(0.0002), 300

    def lane_caller():   # (Lane.run's way: the turn at once where no call holds it or waits, else in its place)
        for i in range(each):
            job = calls.call(f"l{i}")
            if not engine.idle():
                engine.run_now(job)
                continue
            try:
                if engine.take():
                    job()
                else:
                    engine.run_now(job)
            finally:
                engine.end_turn()

    def blocking_caller():
        for i in range(each):
            engine.run_now(calls.call(f"b{i}"))

    def async_caller():
        for i in range(0, each, 3):
            works = [engine.submit(progress.Work("allreduce", calls.call(f"a{i + j}"), engine)) for j in range(3)]
            for work in works[-1:] if i % 2 else works:   # (the last one's wait runs the others first)
                work.wait(timeout=None if i % 2 else 30)

    calls.from_threads({"l": lane_caller, "b": blocking_caller, "a": async_caller}, each)
    assert engine.turn == {}, "the turn was not handed back"

# A done-callback holds its call's turn, so the calls it issues come right after that call, whatever
# another thread queued meanwhile (PowerSGD with several DDP buckets: a bucket's callbacks all-reduce
# P and Q while backward issues the next bucket's all-reduce). Gates, not sleeps, decide what runs when.


@pytest.mark.timeout(20)   # (a deadlock fails)
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


@pytest.mark.timeout(20)
def test_a_callback_attached_after_the_call_is_done_runs_in_the_attaching_thread_in_issue_order():
    engine, log = progress.Engine(_Runtime(), threaded=True), []
    first = engine.submit(progress.Work("allreduce", _job(log, "U0"), engine))
    first.wait()
    queued = engine.submit(progress.Work("allreduce", _job(log, "U1"), engine))
    first.add_done_callback(lambda _: engine.run_now(_job(log, "P0")))   # (not in U0's turn: after U1)
    queued.wait()
    assert [name for name, _ in log] == ["U0", "U1", "P0"]
    assert log[2][1] == threading.get_ident()


@pytest.mark.parametrize("timeout", [None, 1.0])
def test_a_done_callback_waiting_for_a_later_call_is_refused_at_once(patient_engine_thread, timeout):
    """A done-callback holds the turn of the call it follows: a call issued after that one runs only once
    the callback returns, so waiting for it there is refused at once, as a usage error that leaves the
    later call to run (it hung for ever, a ``wait(timeout=)`` too: the bound stopped the runtime, then
    waited for the call without one)."""
    engine, log, refused = _engine(), [], []
    first = engine.submit(progress.Work("allreduce", _job(log, "a"), engine))
    later = []

    def callback(work):
        try:
            later[0].wait(timeout)
        except CollectiveUsageError as error:
            refused.append(str(error))

    first.add_done_callback(callback)
    later.append(engine.submit(progress.Work("barrier", _job(log, "b"), engine)))
    waited = threading.Event()
    threading.Thread(target=lambda: (first.wait(), waited.set()), daemon=True).start()
    assert waited.wait(10), "the callback's wait hung"
    assert refused and refused[0].startswith("wait: this barrier can run only once the done-callback"), refused
    assert later[0].wait() == "b" and engine.runtime.failure is None


def _interrupted():
    raise KeyboardInterrupt   # (a Ctrl-C that landed in the call: its frame stops the runtime and raises it)


def test_a_ctrl_c_in_a_queued_call_that_a_blocking_call_runs_comes_out_of_the_blocking_call(patient_engine_thread):
    """The caller's thread runs the async calls queued before its blocking call: a Ctrl-C in one of them
    is raised there, not the error of the runtime it stopped (it raised CollectiveError, and the Ctrl-C
    came out only of the handle's wait, which a program may never make: a tester's case)."""
    engine, log = _engine(), []
    work = engine.submit(progress.Work("allreduce", _interrupted, engine))
    with pytest.raises(KeyboardInterrupt):
        engine.run_now(_job(log, "blocking"))
    assert log == [] and not engine.turn
    with pytest.raises(KeyboardInterrupt):
        work.wait()


def test_a_ctrl_c_in_an_earlier_call_that_a_wait_runs_comes_out_of_the_wait(patient_engine_thread):
    engine, log = _engine(), []
    engine.submit(progress.Work("allreduce", _interrupted, engine))
    later = engine.submit(progress.Work("barrier", _job(log, "b"), engine))
    with pytest.raises(KeyboardInterrupt):
        later.wait()
    assert log == [] and not engine.turn
