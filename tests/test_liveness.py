"""Tier 1: the liveness watch across hosts (ring.transport.mpi.liveness), no MPI: two "hosts" on the
loopback ("127.0.0.1" and "localhost" are different host names to it, the same machine to TCP).
Across emulated hosts, with real deaths and a host that vanishes: tests/test_hosts.py."""
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from ring.transport.mpi import liveness
from tests.worlds import ROOT

HOSTS = ["127.0.0.1", "localhost"]


def _until(condition, seconds: float = 10.0):
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    return condition()


@pytest.fixture
def pair():
    """Rank 0 (connects) and rank 1 (accepts), on two host names."""
    low, high = liveness.Liveness(), liveness.Liveness()
    ports = [low.port, high.port]
    high.join(1, HOSTS, ports)
    low.join(0, HOSTS, ports)
    yield low, high
    low.close()
    high.close()


def test_a_rank_that_ends_without_a_goodbye_is_gone(pair):
    low, high = pair
    assert high.check() == {} and low.check() == {}
    low.close()   # (as the kernel closes a killed process's sockets)
    assert _until(high.check) == {0: liveness.GONE}


def test_the_watch_goes_both_ways(pair):
    low, high = pair
    assert _until(lambda: high.check() == {} and 0 in high._watched)   # (accepted, its rank read)
    high.close()
    assert _until(low.check) == {1: liveness.GONE}


def _queued(watch: liveness.Liveness, request: int) -> int:
    """Bytes in the kernel's queues of ``watch``'s connections: TIOCOUTQ, sent and not yet
    acknowledged by the peer's kernel; FIONREAD, received and not yet read."""
    return sum(struct.unpack("i", fcntl.ioctl(c.fileno(), request, b"\0" * 4))[0] for c in watch._watched.values())


def test_a_rank_that_says_goodbye_is_not_taken_for_dead(pair):
    low, high = pair
    low.goodbye()
    low.close()
    assert _until(lambda: high.check() == {} and 0 in high.closed)   # (its end of file read: a death's cue)
    assert 0 in high.left and high.check() == {}


def test_pings_are_ignored_and_acknowledged(pair):
    low, high = pair
    _until(lambda: high.check() == {} and 0 in high._watched)
    low.ping()
    high.ping()
    assert _until(lambda: _queued(low, termios.TIOCOUTQ) == _queued(high, termios.TIOCOUTQ) == 0), \
        "a peer's kernel never acknowledged a ping"
    assert low.silent() == [] and high.silent() == []
    # each has read the other's ping (nothing left unread) and still watches it
    assert _until(lambda: low.check() == {} == high.check() and _queued(low, termios.FIONREAD) == 0
                  and _queued(high, termios.FIONREAD) == 0)
    assert list(low._watched) == [1] and list(high._watched) == [0]


def test_a_killed_process_is_gone_at_once():
    """Rank 1 in another process, SIGKILLed: its kernel closes the connection, so once the process
    has ended the watch reads end-of-file: GONE. (A watch that had to wait for silence would say
    UNREACHABLE, after keepalive's UNREACHABLE_SECONDS.)"""
    low = liveness.Liveness()
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ring.transport.mpi import liveness\n"
        "me = liveness.Liveness(); print(me.port, flush=True)\n"
        "ports = [int(sys.stdin.readline()), me.port]\n"
        "me.join(1, ['127.0.0.1', 'localhost'], ports)\n"
        "while True: me.check(); print('watching', flush=True); time.sleep(0.05)")],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        child.stdin.write(f"{low.port}\n")
        child.stdin.flush()
        low.join(0, HOSTS, [low.port, port])
        assert child.stdout.readline() == "watching\n"
        assert low.check() == {}
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _until(low.check) == {1: liveness.GONE}
    finally:
        child.kill()
        child.wait()
        low.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_keep_a_rank_alive(pair):
    """A data loader's worker forked by rank 0 must not hold rank 0's connection open after it dies."""
    low, high = pair
    hold, release = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: lives until the test has looked (its end of the pipe closes), then leaves
        try:
            os.close(release)
            os.read(hold, 1)
        finally:
            os._exit(0)
    os.close(hold)
    try:
        low.close()
        assert _until(high.check) == {0: liveness.GONE}
    finally:
        os.close(release)
        os.waitpid(pid, 0)


def test_a_peer_that_cannot_be_reached_is_said_once_and_not_watched(capfd):
    low = liveness.Liveness()
    closed = liveness.Liveness()
    port = closed.port
    closed.close()   # nothing listens there any more
    try:
        low.join(0, HOSTS, [low.port, port])
        assert low.check() == {}
        err = capfd.readouterr().err
        assert err.startswith("[rank 0] collectives: cannot watch rank 1 on localhost:") and \
            "seen only at the timeout" in err, err
    finally:
        low.close()
