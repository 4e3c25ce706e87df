"""The watchdog's clock, moved only by the test, and device work that counts the watchdog's looks
(plain objects stand in for CUDA events)."""
import threading
import time
import types

import pytest

from ring.transport.gpu import watchdog as watchdog_module

LOOK_BOUND_S = 30   # how long a test waits for the watchdog's thread to look (it looks every 20 ms)


class Clock:
    """time.monotonic for the watchdog, moved only by the test."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.fixture
def watchdog_clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(watchdog_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    return clock


class Work:
    """Device work as the watchdog sees it: ``done`` is read at each look, and each look is counted."""

    def __init__(self, done=False):
        self.finished = done
        self.looks = 0
        self._looked = threading.Condition()

    @property
    def done(self):
        with self._looked:
            self.looks += 1
            self._looked.notify_all()
        return self.finished

    def looked_at_twice_more(self, unless=lambda: False):
        """Wait until the watchdog has looked at this work twice more (the first look may have begun
        before the caller's change; the second began after it, when the first one's verdict was in),
        or until ``unless()`` (it fired: then it looks no more)."""
        with self._looked:
            target = self.looks + 2
            give_up = time.monotonic() + LOOK_BOUND_S
            while self.looks < target and not unless():
                assert time.monotonic() < give_up, f"the watchdog did not look at the work within {LOOK_BOUND_S} s"
                self._looked.wait(0.05)
