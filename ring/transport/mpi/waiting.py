"""The one poll loop every wait of the MPI transport runs once its quick polls have not finished
it (``wait_for``): a collective's requests, point-to-point messages, alike.

Between polls it pauses (``ring.transport.host_waits.pause``: spin, yield, nap); every
CHECK_INTERVAL seconds, and at once when the launcher's failure notice comes, it asks the control
plane whether a peer it needs is gone (``Control.check_peers``, which raises PeerLost); a
collective's wait near its deadline asks the other ranks which call they are in (the roll call
a timeout reports); once the bound passes it raises the bound's error, naming the peer it still
waits for. For a collective with timeout=3 that rank 2 never joins::

    0.0 s   quick polls, then the control channel read once (a question that came meanwhile)
    0.5 s   check_peers: nobody gone            (again at 1.0, 1.5 ...)
    2.0 s   roll call asked ahead (deadline - ROLL_CALL_GRACE)
    3.0 s   TransportTimeout naming rank 2; the census has the answers already

With a timeout under 2 s the question goes out half way, and a census still waiting for answers
at the deadline keeps the wait polling until they are in (at most ROLL_CALL_GRACE after the
question), and DRAIN_SECONDS more where they all came: a call completed meanwhile completes, on
this rank as on the late one. Where every rank has answered from inside the call (one came late,
and its messages are on their way), the wait goes on ROLL_CALL_GRACE past the deadline.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from ring.transport.base import ROLL_CALL_GRACE, Bound, PeerLost
from ring.transport.mpi.control import COLLECTIVE, Control
from ring.transport.host_waits import pause

CHECK_INTERVAL = 0.5   # seconds between looks at the control channel and the local peers' processes
#: How long a wait goes on polling once a rank it needs is found gone, before it raises: a rank that
#: died right after doing its part of a call has sent its messages, and this rank's part can still
#: finish, as it did on the ranks that were quicker. Without it the ranks split on whether the call
#: happened (an elastic job's ranks went back to different steps).
DRAIN_SECONDS = 0.2
#: ... and at least this many polls: on a loaded machine the rank may not run at all during those
#: seconds, and what decides whether its part finishes is the polls that move MPI's progress.
#: (A collective's wait only, or a point-to-point wait that finds the death first: a later
#: point-to-point wait raises at once. Its messages are with living ranks, so each one finished in
#: the drain, and a parameter server and a worker went on training for half a minute without the
#: dead rank, each wait 0.25 s longer, before any of them said it was gone.)
DRAIN_POLLS = 20
#: How often a wait past its deadline reads the census's answers (as ``Control.roll_call`` does).
ANSWERS_READ_SECONDS = 5e-3


def wait_for(done: Callable[[], bool], bound: Bound, control: Control, spin_seconds: float,
             waiting_for: Callable[[], int | None], expecting: Any = COLLECTIVE) -> None:
    """Poll ``done()`` until it is true; raise PeerLost (a peer that ``expecting`` needs is gone:
    see ``Control.check_peers``; COLLECTIVE: the ranks of collective ``bound.seq``; DRAIN_SECONDS
    and DRAIN_POLLS after it is found, unless ``done()`` comes true meanwhile, also after a farewell in
    a point-to-point wait; at once in a point-to-point wait that began with a death already seen, and
    in a collective that a rank said it left or gave up before completing) or, once
    ``bound`` passes, its error naming ``waiting_for()``, the rank (as the control plane names
    it) still pending (None: any rank)."""
    seq = bound.seq if expecting is COLLECTIVE else None
    name = getattr(bound, "name", "")   # (a collective's bound is its Call, which has the collective's name)
    control.read(seq, name)   # (a roll call's question that came while this rank computed: answered now)
    started = time.monotonic()
    bound.wait_begins(started)
    # Near the deadline a collective asks who is in which call, so that a timeout's roll call is
    # answered by the deadline, not a grace period after it (a short wait asks half way).
    ask_at = max(bound.until - ROLL_CALL_GRACE, (started + bound.until) / 2) if seq else math.inf
    heard = control.dead or control.departed or control.gave_up
    next_check, notices = started + (0.0 if heard else CHECK_INTERVAL), control.checked_notices
    # (a notice that came while this rank computed, before the wait, is looked into at once: else it
    # waited CHECK_INTERVAL; so is a death already seen, by a wait that drained after it, and a rank's
    # farewell or give-up that the read above found: a rank that came to a call a rank had given up,
    # with no pause before it, waited CHECK_INTERVAL to hear it)
    lost, drain_until = None, math.inf   # (a PeerLost found, held DRAIN_SECONDS while this rank's part may finish)
    drain_polls = 0
    drains = expecting is COLLECTIVE or not control.dead
    next_read, waited_for_answers, settled = 0.0, False, 0.0   # (past the deadline, while the census waits: below)
    while not _done(done, lost):
        pause(time.monotonic() - started, spin_seconds, bound.background)
        now = time.monotonic()   # (after the nap: read before it, a deadline passed in it was seen a nap late)
        if lost is not None:
            drain_polls += 1
            if now >= drain_until and drain_polls >= DRAIN_POLLS:
                raise lost
            continue
        if now >= next_check or notices != control.notices():
            notices = control.notices()
            try:
                control.check_peers(seq, expecting)
            except PeerLost as e:
                if not drains or e.said and expecting is COLLECTIVE:   # (a rank that said it left or gave the call
                    raise   # up before completing it: the call fails whatever this rank's part does, no drain
                    # helps; a point-to-point message it sent before it left may still be on its way)
                lost, drain_until = e, now + DRAIN_SECONDS
                continue
            next_check = now + min(CHECK_INTERVAL, control.look_again_in())
        if now >= ask_at:
            control.ask(seq)
            ask_at = math.inf
        if bound.passed(now) and not bound.stop.is_set() and seq is not None:
            # The census that a timeout reports may still wait for answers (a short timeout asks half
            # way: up to ROLL_CALL_GRACE past the deadline). Meanwhile this wait keeps polling: a rank
            # that comes now completes the call with the data this rank sent, and so must this rank,
            # instead of the ranks splitting on whether it happened. Where the last answers came past
            # the deadline, every rank still talks: the wait polls DRAIN_SECONDS more, for the
            # messages of a rank that came late to reach the ranks that wait for them in turn.
            if control.answers_due(seq, now):
                if now >= next_read:
                    control.read(seq, name)
                    next_read = now + ANSWERS_READ_SECONDS
                waited_for_answers = True
                continue
            if not settled:   # (answers read a nap ago, or before the deadline: one may have come since,
                control.read(seq, name)   # from a rank that now completes)
            if not settled and control.all_here(seq, name):
                # Every rank said it is in this call: none is absent, one came late and its messages are
                # on their way. Raising now would split this rank from those that receive them in time and
                # complete; it waits for them up to as long past the deadline as a census waits for answers.
                settled = max(bound.until + ROLL_CALL_GRACE, now + DRAIN_SECONDS)
            elif waited_for_answers and control.all_answered():
                settled = settled or now + DRAIN_SECONDS
            if settled and now < settled:
                if now >= next_read:   # (a rank that gives the call up meanwhile ends the wait: see check_peers)
                    next_check, next_read = now, now + ANSWERS_READ_SECONDS
                continue
        if bound.passed(now):
            if done():   # (it may have completed while this wait napped: up to 10 ms, past a second of waiting)
                return
            if not bound.stop.is_set() and now < next_check:
                control.check_peers(seq, expecting)   # (a rank gone, or that gave the call up, since the last look
                # says more than a timeout: a late rank's short wait ends before its first look)
            peer = waiting_for()
            if peer is None:
                raise bound.expired(now - started, -1, "a message from any rank")
            raise bound.expired(now - started, peer)


def _done(done: Callable[[], bool], lost: PeerLost | None) -> bool:
    """``done()``; while a wait drains after finding a rank gone (``lost``), an error it raises gives
    way to that PeerLost, which says it better (Open MPI reports the dead peer on a request)."""
    if lost is None:
        return done()
    try:
        return done()
    except Exception:
        raise lost from None
