"""Tier 1: the watchdog that bounds device work in time (plain objects stand in for CUDA events).

The watchdog reads its time from a clock the tests move (``watchdog_clock``), and each piece of work
counts how often the watchdog looked at it: so a test knows that the watchdog has looked after a
deadline passed, instead of sleeping and hoping that a busy machine let it look by then.
"""
import threading

import pytest

from tests.support.watchdog import LOOK_BOUND_S, Work, watchdog_clock  # noqa: F401 - (a fixture: the watchdog's clock)

from ring.transport.gpu.watchdog import Watchdog


pytestmark = pytest.mark.quick   # (no device, no MPI: fast)


def watching(period=0.02):
    calls, threads = [], []
    fired = threading.Event()

    def on_expiry(message):
        calls.append(message)
        threads.append(threading.current_thread())
        fired.set()
    return Watchdog(on_expiry, period), calls, fired, threads


def test_work_done_in_time_never_fires(watchdog_clock):
    dog, calls, fired, _ = watching()
    work, later = Work(), Work()
    dog.watch(work, watchdog_clock.now + 10)
    dog.watch(later, watchdog_clock.now + 10_000)   # (still watched after `work` is done: its looks are counted)
    watchdog_clock.now += 5
    work.finished = True
    watchdog_clock.now += 100                       # past the deadline of `work`, which finished in time
    later.looked_at_twice_more(unless=fired.is_set)
    dog.stop()
    assert calls == [] and not fired.is_set() and not dog.expired, calls


def test_unfinished_work_past_its_deadline_fires_once(watchdog_clock):
    dog, calls, fired, threads = watching()
    dog.watch(Work(done=True), watchdog_clock.now - 5)        # finished long ago: never counts
    work = Work()
    dog.watch(work, watchdog_clock.now + 10)
    work.looked_at_twice_more(unless=fired.is_set)
    assert not fired.is_set(), "fired before the deadline"
    watchdog_clock.now += 10.5
    assert fired.wait(LOOK_BOUND_S), "unfinished work past its deadline did not fire"
    threads[0].join(LOOK_BOUND_S)
    assert not threads[0].is_alive(), "the watchdog kept watching after it fired (it could fire again)"
    assert calls == [dog.expired] and "still unfinished 0.5 s after that collective's deadline" in dog.expired
    dog.stop()


def test_the_latest_work_of_a_collective_stands_for_its_earlier_work(watchdog_clock):
    dog, _, fired, _ = watching()
    deadline = watchdog_clock.now + 10
    early, late, later = Work(), Work(done=True), Work()
    dog.watch(early, deadline)
    dog.watch(late, deadline)       # the same collective (same deadline), queued after: covers `early`
    dog.watch(later, deadline + 10_000)
    watchdog_clock.now += 20
    later.looked_at_twice_more(unless=fired.is_set)
    assert not fired.is_set(), "fired for work that the collective's later work covers"
    dog.stop()


def test_later_collectives_wait_their_own_deadline(watchdog_clock):
    dog, _, fired, _ = watching()
    first, second = Work(), Work()
    dog.watch(first, watchdog_clock.now + 10)
    dog.watch(second, watchdog_clock.now + 100)
    first.finished = True
    watchdog_clock.now += 50
    second.looked_at_twice_more(unless=fired.is_set)
    assert not fired.is_set(), "the second is unfinished but not yet due"
    watchdog_clock.now += 60
    assert fired.wait(LOOK_BOUND_S), "the second collective's deadline passed and nothing fired"
    dog.stop()


def watchdog_threads(before):
    return [t for t in threading.enumerate() if t.name == "collectives-watchdog" and t not in before]


def test_a_watchdog_starts_its_thread_with_the_first_work_and_stop_ends_it(watchdog_clock):
    before = set(threading.enumerate())
    idle, _, _, _ = watching()
    assert watchdog_threads(before) == [], "a watchdog with nothing to watch started a thread"
    idle.stop()   # (nothing to stop: must return at once)
    dog, calls, _, _ = watching()
    dog.watch(Work(), watchdog_clock.now + 10)
    assert len(watchdog_threads(before)) == 1
    dog.stop()
    assert watchdog_threads(before) == [] and calls == [] and not idle.expired and not dog.expired
