"""Tier 1: the NCCL transport's bookkeeping under the real ring, with NCCL itself played by a fake.

No GPU here: host arrays stand in for device buffers and a fake communicator
moves bytes between the ranks' threads by address. NCCL's rule is kept: the
operations of one group run together (every send of a group is delivered, then
its receives wait for their data), operations of later groups wait for earlier
ones, and each send must be matched by a receive of the same size. What this
checks is ours: that the grouping never hangs a rendezvous (the fake fails where
NCCL would hang, see the test of the fake itself), the addresses and sizes of
segments, and that every collective comes out right on n = 1..6.
What it cannot check is NCCL and CUDA themselves (tests/test_gpu.py, on a GPU).
"""
import ctypes
import queue
import threading
import types

import numpy as np
import pytest

from tests.support.watchdog import Work, watchdog_clock  # noqa: F401 - (a fixture: the watchdog's clock, moved by the test)

from ring.transport.base import Bound, TransportError, unbounded
from ring.transport.gpu import nccl as nccl_transport
from tests.support.simulated import allreduce_each, check_allgather_then_broadcast, rank_input, reference, simulate


class FakeNccl:
    """The module-level part of cupy.cuda.nccl that the transport uses, for a world of threads.

    Groups run one after another on each rank (one stream). Within a group every send
    is offered first, then every receive waits for its data, then the group waits
    until its sends have been taken: a send completes only when its receiver runs the
    matching receive, as NCCL's do for large messages. So a schedule that would hang
    on NCCL hangs here too, and fails by timeout instead.
    """
    NCCL_INT8 = 0
    NcclError = RuntimeError
    PATIENCE = 5.0

    def __init__(self, n):
        self.wires = {(s, d): queue.Queue() for s in range(n) for d in range(n)}
        self.groups = {}     # rank -> the groups it posted, each a list of (kind, peer, nbytes)
        self.open = {}
        self.work_finishes = True   # False: queued work never finishes (a peer that never does its part)
        self.events = []            # every event the transport recorded, in order (the watchdog's looks counted)

    def groupStart(self):
        self.open[threading.get_ident()] = []

    def groupEnd(self):
        ops = self.open.pop(threading.get_ident())
        taken = [op.start() for op in ops if op.kind == "send"]
        for op in ops:
            if op.kind == "recv":
                op.start()
        for event in taken:
            assert event.wait(self.PATIENCE), "a send was never received: this schedule would hang on NCCL"
        if ops:
            self.groups.setdefault(ops[0].rank, []).append([(op.kind, op.peer, op.nbytes) for op in ops])


class FakeComm:
    """One rank's communicator: send and recv only note the operation in the open group."""

    def __init__(self, fake, rank):
        self.fake, self.rank = fake, rank
        self.ended = []   # "abort" / "destroy", as called

    def abort(self):
        self.ended.append("abort")

    def destroy(self):
        self.ended.append("destroy")

    def send(self, address, nbytes, datatype, peer, stream):
        self._note(_Op("send", self, address, nbytes, peer))

    def recv(self, address, nbytes, datatype, peer, stream):
        self._note(_Op("recv", self, address, nbytes, peer))

    def _note(self, op):
        self.fake.open[threading.get_ident()].append(op)


class _Op:
    def __init__(self, kind, comm, address, nbytes, peer):
        self.kind, self.fake, self.rank = kind, comm.fake, comm.rank
        self.address, self.nbytes, self.peer = address, nbytes, peer

    def start(self):
        if self.kind == "send":
            taken = threading.Event()
            self.fake.wires[(self.rank, self.peer)].put((ctypes.string_at(self.address, self.nbytes), taken))
            return taken
        try:
            payload, taken = self.fake.wires[(self.peer, self.rank)].get(timeout=self.fake.PATIENCE)
        except queue.Empty:
            raise AssertionError(f"rank {self.rank}: a receive from {self.peer} never got data") from None
        assert len(payload) == self.nbytes, f"rank {self.rank}: {len(payload)} bytes sent, {self.nbytes} expected"
        ctypes.memmove(self.address, payload, self.nbytes)
        taken.set()


@pytest.fixture
def fake_nccl(monkeypatch):
    def install(n):
        fake = FakeNccl(n)
        stream = types.SimpleNamespace(ptr=0)

        class Event(Work):   # the groups above run to the end before returning: their work is done, unless told not
            def __init__(self, block=False, disable_timing=False):
                super().__init__()
                fake.events.append(self)

            def record(self, stream):
                self.finished = fake.work_finishes

        cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream, Event=Event))
        monkeypatch.setattr(nccl_transport, "_cupy", lambda: cupy)
        monkeypatch.setattr(nccl_transport, "_nccl", lambda: fake)
        return fake
    return install


def over_nccl(fake, body):
    return lambda host: body(nccl_transport.NCCLTransport(FakeComm(fake, host.rank), host))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("segment", [1, 5, 1000])
@pytest.mark.parametrize("in_place", [False, True])
def test_allreduce_over_the_nccl_transport(fake_nccl, n, segment, in_place):
    fake = fake_nccl(n)
    inputs = [rank_input(r, 101, np.float32) for r in range(n)]
    expected = reference(inputs, "sum")
    for result in simulate(n, over_nccl(fake, allreduce_each(inputs, "sum", segment, in_place))):
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_allgather_and_broadcast_over_the_nccl_transport(fake_nccl, n):
    fake = fake_nccl(n)
    check_allgather_then_broadcast(n, lambda body: over_nccl(fake, body), [(r * 5) % 7 + 1 for r in range(n)],
                                   np.int64, root=n - 1, segments=(2, 3))


def test_the_fake_hangs_where_nccl_would_so_the_tests_above_can_fail(fake_nccl):
    fake = fake_nccl(2)
    fake.PATIENCE = 0.5

    def send_first_in_its_own_group(host):   # both ranks send before receiving, ungrouped
        comm = FakeComm(fake, host.rank)
        mine, theirs = np.full(4, host.rank, np.float64), np.zeros(4)
        for op in (comm.send, comm.recv):
            fake.groupStart()
            op(mine.ctypes.data if op == comm.send else theirs.ctypes.data, 32, 0, 1 - host.rank, 0)
            fake.groupEnd()

    with pytest.raises(AssertionError, match="would hang on NCCL"):
        simulate(2, send_first_in_its_own_group)


def test_nothing_is_posted_until_a_wait(fake_nccl):
    fake = fake_nccl(2)

    class Host:
        rank, size, local_rank, local_size = 0, 2, 0, 2

    transport, bound = nccl_transport.NCCLTransport(FakeComm(fake, 0), Host()), unbounded()
    send, recv = np.arange(4.0), np.zeros(4)
    transport.recv_from_left(recv, bound)
    transport.send_to_right(send, bound)
    assert fake.groups == {} and fake.wires[(0, 1)].empty()
    fake.wires[(1, 0)].put((np.full(4, 7.0).tobytes(), threading.Event()))   # what rank 1 would send
    threading.Timer(0.2, lambda: fake.wires[(0, 1)].get()[1].set()).start()  # and rank 1 taking ours
    transport.wait(None, bound)
    assert fake.groups == {0: [[("recv", 1, 32), ("send", 1, 32)]]}
    np.testing.assert_array_equal(recv, np.full(4, 7.0))


def one_exchange_due_in(fake, clock, seconds):
    """A one-rank NCCLTransport (watchdog looking every 50 ms) that has queued one exchange due in
    ``seconds`` by ``clock`` (the watchdog's, which the test moves)."""
    class Host:
        rank, size, local_rank, local_size = 0, 1, 0, 1

    comm = FakeComm(fake, 0)
    transport = nccl_transport.NCCLTransport(comm, Host())
    transport.watchdog._period = 0.05
    buf = np.zeros(4)
    transport.exchange(buf, buf, Bound(1, clock.now + seconds, threading.Event()), dest=0, source=0)
    return comm, transport, buf


def test_work_unfinished_after_the_deadline_aborts_the_communicator(fake_nccl, watchdog_clock, capsys):
    fake = fake_nccl(1)
    fake.work_finishes = False
    comm, transport, buf = one_exchange_due_in(fake, watchdog_clock, 10)   # queued; "never finishes"
    fake.events[-1].looked_at_twice_more(unless=lambda: comm.ended)
    assert comm.ended == [] and not transport.watchdog.expired, "aborted before the deadline"
    watchdog_clock.now += 10.5
    fake.events[-1].looked_at_twice_more(unless=lambda: comm.ended or transport.watchdog.expired)
    transport.watchdog.stop()   # (joins its thread: an abort it was about to make is made)
    assert comm.ended == ["abort"], "unfinished work past its deadline did not abort the communicator"
    assert "rank 0: device work queued by a collective was still unfinished" in capsys.readouterr().err
    with pytest.raises(TransportError, match="NCCL communicator was aborted: device work queued"):
        transport.exchange(buf, buf, unbounded(), dest=0, source=0)
    transport.close()
    assert comm.ended == ["abort"]   # not destroyed after the abort


def test_finished_work_is_never_aborted_and_the_communicator_is_destroyed_at_close(fake_nccl, watchdog_clock):
    fake = fake_nccl(1)
    comm, transport, buf = one_exchange_due_in(fake, watchdog_clock, 10)   # finished at once
    fake.work_finishes = False
    later = Bound(2, watchdog_clock.now + 10_000, threading.Event())   # a later collective's work, unfinished
    transport.exchange(buf, buf, later, dest=0, source=0)   # but not due: its looks are counted after the first's end
    watchdog_clock.now += 100
    fake.events[-1].looked_at_twice_more(unless=lambda: comm.ended)
    assert comm.ended == [] and not transport.watchdog.expired, "aborted for work that had finished"
    transport.close()
    assert comm.ended == ["destroy"]
