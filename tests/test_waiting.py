"""Tier 1: the poll loop every wait of the MPI transport runs (``ring.transport.mpi.waiting.wait_for``),
on a control plane the test plays: when a rank found gone ends a wait, and when the wait may still
finish first (the drain). No MPI."""
import threading
import time
from types import SimpleNamespace

import pytest

from ring.transport import base, host_waits
from ring.transport.base import ROLL_CALL_GRACE, Bound, PeerLost
from ring.transport.mpi.control import COLLECTIVE, Control
from ring.transport.mpi import waiting
from ring.transport.mpi.waiting import wait_for


class _Control:
    """The control plane of a job whose rank 1 died (``Control.check_peers`` raises, naming it); ``seen``:
    a wait before this one had found it already (``Control.dead``)."""

    def __init__(self, seen: bool):
        self.dead = {1} if seen else set()
        self.departed, self.gave_up = {}, {}   # (farewells and give-ups read: none)
        self.checked_notices = 0
        self.looked = 0

    def read(self, seq, name=""):
        pass

    def notices(self):
        return 0

    def check_peers(self, seq, expecting):
        self.looked += 1
        self.dead.add(1)
        raise PeerLost(1, "rank 1 is gone")

    def look_again_in(self):
        return 0.5

    def ask(self, seq):
        pass


def _answered_after_a_look(control: _Control):
    """A wait's ``done``: its messages (with living ranks) are in once the control plane has been looked at."""
    return lambda: control.looked > 0


def _wait(control: _Control, expecting, seq=None) -> None:
    bound = Bound(seq, until=time.monotonic() + 30, stop=threading.Event())
    wait_for(_answered_after_a_look(control), bound, control, 0.0, lambda: 3, expecting)


@pytest.mark.parametrize("expecting", [{3}, None], ids=["from rank 3", "from any rank"])
def test_a_point_to_point_wait_that_finds_a_death_first_may_still_finish(expecting):
    """The death is new: the messages this wait needs may be on their way; they are taken."""
    control = _Control(seen=False)
    _wait(control, expecting)
    assert control.looked == 1 and control.dead == {1}


@pytest.mark.parametrize("expecting", [{3}, None], ids=["from rank 3", "from any rank"])
def test_a_later_point_to_point_wait_raises_a_death_already_seen_at_once(expecting):
    """A parameter server and a worker went on training without the dead rank: each of their waits
    found it, drained, and finished, for half a minute, and none of them said it was gone."""
    control = _Control(seen=True)
    with pytest.raises(PeerLost, match="rank 1 is gone"):
        _wait(control, expecting)


def test_a_collective_wait_drains_after_a_death_seen_before():
    """A collective's ranks must agree on whether it happened: the dead rank may have done its part of
    this call before it died, so a wait that can still finish does, on every rank that can."""
    control = _Control(seen=True)
    _wait(control, COLLECTIVE, seq=5)
    assert control.looked == 1


class _Quiet(_Control):
    """A control plane with nobody gone."""

    def __init__(self):
        super().__init__(seen=False)

    def check_peers(self, seq, expecting):
        self.looked += 1


class _Clock:
    """A clock that moves only when the wait naps: each nap is 10 ms."""

    def __init__(self):
        self.now = 100.0

    @classmethod
    def installed(cls, monkeypatch) -> "_Clock":
        """A clock that ``wait_for`` reads and naps on, in place of the real ones."""
        clock = cls()
        monkeypatch.setattr(waiting, "time", clock)
        monkeypatch.setattr(waiting, "pause", clock.nap)
        return clock

    def monotonic(self):
        return self.now

    def nap(self, waited, spin_seconds, background=False):
        self.now += 10e-3


def test_a_wait_that_napped_past_its_deadline_takes_what_came_meanwhile_instead_of_raising(monkeypatch):
    """Past a second of waiting, a wait naps 10 ms between polls; the deadline may pass during a nap,
    and a message that comes in that nap (here 2 ms after the deadline, before the nap ends) must
    complete the wait: the others' part of the call came, as it did on the rank that sent it."""
    clock = _Clock.installed(monkeypatch)
    bound = Bound(None, until=clock.now + 0.105, stop=threading.Event(), background=True)
    arrives = bound.until + 2e-3
    wait_for(lambda: clock.now >= arrives, bound, _Quiet(), 0.0, lambda: 3, None)
    assert clock.now < arrives + 10e-3


def test_a_wait_raises_at_its_first_look_at_the_clock_past_the_deadline_not_a_nap_later(monkeypatch):
    """The loop read the clock, napped, then compared what it had read with the deadline: a deadline
    passed during a nap was seen only after the next nap, 10 ms late on every timeout."""
    clock = _Clock.installed(monkeypatch)
    bound = Bound(None, until=clock.now + 0.105, stop=threading.Event())
    with pytest.raises(Exception, match="timed out"):
        wait_for(lambda: False, bound, _Quiet(), 0.0, lambda: 3, None)
    assert bound.until <= clock.now < bound.until + 10e-3


class _Census(_Quiet):
    """A control plane whose roll call, asked on the clock, is answered at ``answer_at``: the answer
    is seen by the first read from then on; answers are due until ROLL_CALL_GRACE after the question."""

    def __init__(self, clock: _Clock, answer_at_grace_end_less: float):
        super().__init__()
        self.clock, self.early = clock, answer_at_grace_end_less
        self.grace_end = self.answer_at = float("inf")
        self.answered = False

    def ask(self, seq):
        self.grace_end = self.clock.now + ROLL_CALL_GRACE
        self.answer_at = self.grace_end - self.early

    def read(self, seq, name=""):
        self.answered = self.answered or self.clock.now >= self.answer_at

    def answers_due(self, seq, now):
        return now < self.grace_end and not self.answered

    def all_answered(self):
        return self.answered

    def all_here(self, seq, name):
        return self.answered and self.from_the_call

    from_the_call = False   # (whether the answers said "in this call": the late rank came before the deadline)


def test_an_answer_that_came_in_the_last_nap_of_the_census_is_read_before_the_wait_judges(monkeypatch):
    """timeout=0.5: the census asks half way and waits ROLL_CALL_GRACE for answers, reading them every
    few ms. A late rank that answered in the last nap before the grace ended was not read: the wait
    raised, while the late rank completed the call with the data this rank had sent (the ranks split,
    in 7 launches of 10 aimed at that moment). Read once more when the grace ends; all answered, the
    wait polls on, and the late rank's part (here 15 ms later) completes the call."""
    clock = _Clock.installed(monkeypatch)
    control = _Census(clock, answer_at_grace_end_less=4e-3)
    bound = Bound(5, until=clock.now + 0.5, stop=threading.Event())
    wait_for(lambda: clock.now >= control.answer_at + 15e-3, bound, control, 0.0, lambda: 3)
    assert control.answered


def test_a_call_every_rank_answered_from_waits_past_its_deadline_for_the_late_ones_messages(monkeypatch):
    """timeout=3: the census asks at 2 s, the late rank answers from inside the call at 2.5 s, and its
    message comes 0.4 s past the deadline: the wait goes on for it (up to ROLL_CALL_GRACE) instead of
    raising at the deadline while the late rank completes with the data this rank sent."""
    clock = _Clock.installed(monkeypatch)
    control = _Census(clock, answer_at_grace_end_less=0.5)
    control.from_the_call = True
    bound = Bound(5, until=clock.now + 3.0, stop=threading.Event())
    wait_for(lambda: clock.now >= bound.until + 0.4, bound, control, 0.0, lambda: 3)
    assert control.answered and bound.until + 0.4 <= clock.now < bound.until + ROLL_CALL_GRACE


def test_a_call_some_rank_did_not_answer_from_still_times_out_at_its_deadline(monkeypatch):
    """The same, but the answers do not all say "in this call" (a rank computing elsewhere): the wait
    raises at its deadline, as before."""
    clock = _Clock.installed(monkeypatch)
    control = _Census(clock, answer_at_grace_end_less=0.5)
    bound = Bound(5, until=clock.now + 3.0, stop=threading.Event())
    with pytest.raises(Exception, match="timed out"):
        wait_for(lambda: clock.now >= bound.until + 0.4, bound, control, 0.0, lambda: 3)
    assert bound.until <= clock.now < bound.until + 0.4


def test_a_rank_that_answered_the_census_and_then_left_counts_once():
    """n=4, timeout=1: rank 1 came late, answered rank 2's census, completed the call and ended its
    program (its farewell) before rank 0, waiting in the call since its start, had read the question.
    Counted twice, rank 1 made the census look complete at rank 2's deadline: rank 2 raised, naming rank 0
    "not answering", while ranks 1 and 3 completed (1 launch in 20 beside a CPU hog)."""
    control = Control.__new__(Control)   # (its census books alone: no MPI)
    control.size, control._heard, control.departed = 4, {1: (2, "barrier"), 3: (2, "barrier")}, {1: (False, 2, "")}
    assert not control.all_answered()
    control._heard[0] = (2, "barrier")
    assert control.all_answered()


@pytest.mark.parametrize("message_after", [1.5, None], ids=["its message comes", "nothing comes"])
def test_a_wait_after_this_rank_computed_past_the_timeout_still_waits_the_timeout(monkeypatch, message_after):
    """timeout=2: this rank computed 3 s since the call's last progress (the plan of a call of many
    small segments, say), and the rank it waits for, computing alike, sends 1.5 s after this wait
    begins. The wait waits for it: 2 s from its start, not 2 s from the last progress, which had passed
    before it began (then it failed at once, saying it had waited 5 s, with every rank in the call).
    Where nothing comes, it fails as a wait of 2 s (and its census's grace) would, naming that time."""
    clock = _Clock.installed(monkeypatch)
    monkeypatch.setattr(base, "time", clock)   # (the error's figure reads the clock too)
    control = _Census(clock, answer_at_grace_end_less=-1.0)   # (the census is never answered)
    bound = Bound(5, until=clock.now - 1.0, stop=threading.Event(), window=2.0)   # (last progress 3 s ago)
    began = clock.now
    if message_after is not None:
        wait_for(lambda: clock.now >= began + message_after, bound, control, 0.0, lambda: 3)
        assert clock.now < began + message_after + 0.02
        return
    with pytest.raises(Exception, match=r"timed out after (\d\.\d+|\d) s") as raised:
        wait_for(lambda: False, bound, control, 0.0, lambda: 3)
    waited = float(str(raised.value).split("timed out after ")[1].split(" s")[0])
    assert began + 2.0 <= clock.now <= began + 2.0 + ROLL_CALL_GRACE + 0.02 and waited == pytest.approx(clock.now - began, abs=0.05)


def test_a_rank_that_gave_up_on_its_own_account_is_named_before_one_that_left_after_its_failure():
    """n=4: rank 1 is ending (Ctrl-C) and gives the call up; rank 0 hears it, fails, and leaves; rank 3
    read rank 0's farewell and rank 1's give-up, not yet rank 1's farewell. It named rank 0, `rank 0 left:
    it stopped after a failure: ...`, not the rank that caused it (1 launch of 7243 tests, beside a hog)."""
    control = Control.__new__(Control)   # (its books alone: no MPI)
    control.names, control.roots, control.dead_names = list(range(4)), set(), {}
    control.departed = {0: (True, 3, "it stopped after a failure: allreduce #4 on rank 0: rank 1 gave up ...")}
    control.gave_up = {1: (False, 3, "rank 1 is ending (uncaught KeyboardInterrupt)"),
                       0: (True, 3, "allreduce #4 on rank 0: rank 1 gave up ...")}
    with pytest.raises(PeerLost) as raised:
        control._raise_if_left(4)
    assert str(raised.value).startswith("rank 1 gave up") and "rank 1 is ending (uncaught KeyboardInterrupt)" \
        in str(raised.value), raised.value
    del control.gave_up[1]   # (only ranks that stopped after a failure: the farewell read first is named)
    with pytest.raises(PeerLost, match="^rank 0 left: it stopped after a failure"):
        control._raise_if_left(4)


def test_a_wait_keeps_its_core_for_its_first_millisecond_then_gives_it_up_between_polls(monkeypatch):
    """MPICH moves a large message between two ranks of a host in pieces, each as both ranks poll: a
    rank that gave its core to another process after 50 us stalled a 1 MiB broadcast beside a
    background job (docs/performance.md). A wait not yet 1 ms old spins; an older one yields; past
    20 ms it naps. (Where ranks outnumber cores, ``spin_seconds`` is 0: it yields from the start.)"""
    yields, naps = [], []
    monkeypatch.setattr(host_waits, "os", SimpleNamespace(sched_yield=lambda: yields.append(1)))
    monkeypatch.setattr(host_waits, "time", SimpleNamespace(sleep=naps.append))
    for waited in (0.0, 60e-6, 900e-6):
        host_waits.pause(waited, host_waits.SPIN_SECONDS)
    assert not yields and not naps, "a wait younger than a millisecond gave up its core"
    host_waits.pause(1.5e-3, host_waits.SPIN_SECONDS)
    assert yields == [1] and not naps
    host_waits.pause(30e-3, host_waits.SPIN_SECONDS)
    assert yields == [1] and len(naps) == 1
    host_waits.pause(0.0, 0.0)   # (oversubscribed: no spin)
    assert yields == [1, 1]
