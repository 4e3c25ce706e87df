"""Tier 1: the watchdog that bounds device work in time (events stand in for CUDA events)."""
import threading
import time

from ring.transport.watchdog import Watchdog


class Work:
    def __init__(self, done=False):
        self.done = done


def watching(period=0.02):
    calls = []
    fired = threading.Event()

    def on_expiry(message):
        calls.append(message)
        fired.set()
    return Watchdog(on_expiry, period), calls, fired


def test_work_done_in_time_never_fires():
    dog, calls, fired = watching()
    work = Work()
    dog.watch(work, time.monotonic() + 0.2)
    time.sleep(0.1)
    work.done = True
    assert not fired.wait(0.4) and calls == [] and not dog.expired
    dog.stop()


def test_unfinished_work_past_its_deadline_fires_once():
    dog, calls, fired = watching()
    dog.watch(Work(done=True), time.monotonic() - 5)        # finished long ago: never counts
    start = time.monotonic()
    dog.watch(Work(), start + 0.15)
    assert fired.wait(5)
    assert 0.15 <= time.monotonic() - start < 2
    time.sleep(0.1)
    assert len(calls) == 1 and calls[0] == dog.expired and "still unfinished" in dog.expired
    dog.stop()


def test_the_latest_work_of_a_collective_stands_for_its_earlier_work():
    dog, calls, fired = watching()
    deadline = time.monotonic() + 0.1
    early, late = Work(), Work(done=True)
    dog.watch(early, deadline)
    dog.watch(late, deadline)       # the same collective (same deadline), queued after: covers `early`
    assert not fired.wait(0.4)
    dog.stop()


def test_later_collectives_wait_their_own_deadline():
    dog, calls, fired = watching()
    now = time.monotonic()
    first, second = Work(), Work()
    dog.watch(first, now + 0.1)
    dog.watch(second, now + 10)
    first.done = True
    assert not fired.wait(0.4)      # the second is unfinished but not yet due
    dog.stop()


def test_stop_without_watching_anything():
    dog, _, _ = watching()
    dog.stop()
