"""Fault scenarios for tests/test_faults.py, each run as a user's program:
``mpiexec -n N python -m tests.programs.faults SCENARIO``. Ranks print how they ended:
``rank R: CollectiveError after T s: message``, ``rank R: ok ...``, and so on."""
import atexit
import code
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np

import collectives as col
from collectives.groups.group import Group
from collectives.calls import progress
from ring.transport.host_waits import siblings as _siblings
from tests.programs.cues import CUE_BOUND_S, await_cue, await_cues, await_ended, await_file, cue, report, say, when_inside


def _ints(n: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small rank-dependent integers, exact in float32 whatever the sum."""
    return ((np.arange(n) * 7 + rank * 3 + salt) % 11).astype(np.float32)


def _expected_sum(n: int, size: int, salt: int = 0) -> np.ndarray:
    return sum(_ints(n, r, salt) for r in range(size))


def _three_calls():
    x = _ints(1000, col.rank())
    for _ in range(3):
        col.allreduce(x)


def _then_the_others_wait(victim: int) -> None:
    """Every rank but ``victim`` makes a fourth call, which ``victim`` never joins."""
    if col.rank() != victim:
        report("call 4", col.allreduce, _ints(1000, col.rank()))


def absent() -> None:
    """The last rank never comes to the allreduce (it stays away until every other rank's call has
    ended: cued, so that no stall of theirs lets it end its program first); the others must time
    out naming it."""
    col.barrier()
    last = col.size() - 1
    if col.rank() == last:
        await_cues(range(last))
        say(f"rank {col.rank()}: stayed away")
        return
    x = np.ones(1000, np.float32)
    started = time.monotonic()
    try:
        col.allreduce(x, timeout=2)
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError: {e}")
        say(f"rank {col.rank()}: raised after {time.monotonic() - started:.2f} s")
    finally:
        cue(last)
    try:
        col.allreduce(x, timeout=2)
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: then: {e}")
        raise SystemExit(3)


def stuck() -> None:
    """The last rank is stuck in its own code: for ever (argv[2] "for-ever": only the launcher can
    end it), or until every other process has ended ("until-alone"); the others time out naming
    it, end their programs, and must not wait for it at exit beyond the runtime's timeout
    (COLLECTIVES_TIMEOUT)."""
    from mpi4py import MPI
    pids = MPI.COMM_WORLD.allgather(os.getpid())
    col.barrier()
    if col.rank() == col.size() - 1:
        if sys.argv[2] == "for-ever":
            time.sleep(3600)
        await_ended(pids[:-1])
        say(f"rank {col.rank()}: woke")
        col.allreduce(np.ones(10, np.float32))   # (the others are gone: raises at once)
        return
    try:
        col.allreduce(np.ones(10, np.float32), timeout=2)
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError: {e}")


def stuck_beside_a_part() -> None:
    """Three ranks. Rank 1 is stuck in its own code until ranks 0 and 2 have ended; rank 0 times out
    of a call on the group [0, 1] and ends its program, leaving without MPI_Finalize; rank 2, outside
    the group and healthy, ends its program once rank 0 has ended: it comes to its exit to find rank
    0 gone, and must name rank 1 too (run it under keep_survivors)."""
    pids = col.allgather(np.array([os.getpid()])).tolist()
    g = col.new_group([0, 1])
    if col.rank() == 1:
        await_ended([pids[0], pids[2]])
        say("rank 1: woke")
        return
    if col.rank() == 2:
        await_ended([pids[0]])
        return
    report("call", g.allreduce, np.ones(10, np.float32), timeout=2)


def farewell_alone() -> None:
    """Two ranks. Rank 0 uses the runtime (asks its rank) and ends; rank 1 uses mpi4py only, so nobody
    joins the setup rank 0's exit holds to say farewell: its 10 s wait ends, and it must finalize as
    usual (MPI_Finalize then waits for rank 1). Rank 1 ends once rank 0 is past that wait: a file
    written by rank 0's exit handler registered before its first use of the runtime, which therefore
    runs after the runtime's (and never, where the runtime ends the process itself)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    past = os.path.join(tempfile.gettempdir(), f"collectives-farewell-alone.{comm.allgather(os.getpid())[0]}")
    if comm.Get_rank() == 0:
        atexit.register(lambda: open(past, "w").close())
        say(f"rank {col.rank()}: done")
        return
    await_file(past, f"rank {comm.Get_rank()}", "rank 0's exit past the runtime's")
    os.remove(past)
    say(f"rank {comm.Get_rank()}: done after rank 0's farewell")


def absent_at_setup() -> None:
    """The last rank never calls into the runtime; the others' first call sets up, bounded by its
    timeout. The last rank then ends its program once the others' calls have ended, or (argv[2]
    "for-ever") never: only the launcher can end it. argv[3] "recv": the first call is a receive."""
    last = col.size() - 1
    if col.rank() == last:
        if sys.argv[2:3] == ["for-ever"]:
            time.sleep(3600)
        await_cues(range(last))   # (until the others' calls ended: then it may end its program)
        return
    try:
        if sys.argv[3:] == ["recv"]:   # (a point-to-point call sets the runtime up within its timeout too)
            report("first call", col.recv, np.empty(4), None, 7, timeout=2)
        else:
            report("first call", col.allreduce, np.ones(10, np.float32), timeout=2)
    finally:
        cue(last)


def late_to_setup() -> None:
    """The last rank calls into the runtime only once the others have ended (their first call's setup
    timed out without it: the launcher's processes beside it on this host are gone), with a timeout
    of 30 s: it must fail at once, saying that a process of the job ended."""
    last = col.size() - 1
    if col.rank() == last:
        give_up = time.monotonic() + CUE_BOUND_S
        while _siblings() and time.monotonic() < give_up:
            time.sleep(0.05)
        report("late first call", col.allreduce, np.ones(10, np.float32), timeout=30)
        return
    report("first call", col.allreduce, np.ones(10, np.float32), timeout=2)


def retry_at_setup() -> None:
    """Rank 0's first call times out in the setup (the last rank has not come); rank 0 catches the error,
    cues the last rank to make its first call, and calls again with a longer timeout. Each rank says
    how its call ended."""
    last = col.size() - 1
    x = _ints(10, col.rank())
    if col.rank() == last:
        await_cue(0)
        report("first call", col.allreduce, x, timeout=4)
        return
    try:
        col.allreduce(x, timeout=2)
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: caught {e}")
    cue(last)
    report("retry", col.allreduce, x, timeout=4)


def late() -> None:
    """Rank 0 times out; rank 1 comes after rank 0 has set out (cued by it) and is in the call; rank 2
    never comes: it stays away until rank 1's call has ended too (so rank 1 hears of rank 0 leaving,
    not of rank 2). Cues, not sleeps: a busy machine could stall a sleeping rank past rank 0's
    timeout, or wake the absent one too soon."""
    col.barrier()
    if col.rank() == 2:
        await_cue(1)
        return
    if col.rank() == 0:
        cue(1)
    else:
        await_cue(0)
    try:
        report("call 1", col.allreduce, np.ones(1000, np.float32), timeout=2 if col.rank() == 0 else 30)
    finally:
        if col.rank() == 1:
            cue(2)


def late_with_no_pause() -> None:
    """With the check off (the test sets COLLECTIVES_CHECK=0), rank 0's ring broadcast ends once it
    has sent; rank 0 goes on to an all-reduce with timeout=2 and gives it up while rank 2 is away
    (cued once rank 0's call has raised). Ranks 1 and 2 then end the broadcast and come to the
    all-reduce with no pause (their group has just made progress): each must fail it at once."""
    col.barrier()
    if col.rank() == 2:
        await_cue(0)
    col.broadcast(np.ones(1 << 18, np.float32), root=0, algorithm="ring")
    if col.rank() == 0:
        try:
            report("call", col.allreduce, np.ones(100, np.float32), timeout=2)
        finally:
            cue(2)
            await_cues([1, 2])
        return
    try:
        report("late call", col.allreduce, np.ones(100, np.float32), timeout=30)
    finally:
        cue(0)


def late_after_timeout() -> None:
    """Rank 1 comes to a call only after every other rank timed out of it (cued by each once its call
    has raised): it must fail the call too, not complete it alone with the data the others had sent
    before giving up. argv[2]: "allreduce" (small: recursive doubling), "ring" (large), "barrier",
    "lane-allreduce", "lane-broadcast", "lane-allgather" (small, with no option: the express lane that
    its first call opened, with the timeout set by init), "direct-broadcast", "direct-allgather",
    "direct-allreduce" (the same, large: on two ranks the lane of the ring's or halving's messages), or "group-allreduce", "group-barrier" (on a group of every rank, made
    first: its give-up is sent beside the world's); argv[3]: "staying" (the others live on until
    rank 1's call has ended: their give-up message tells it), "gone" (they end their programs:
    their farewells tell it) or "ended" (likewise, and rank 1 waits for their processes to end
    without a cue, so that no MPI call of its own moves their words meanwhile); argv[4], if given: the late rank's timeout (30 s: "inf", say)."""
    call, others = sys.argv[2], sys.argv[3]
    pids = col.allgather(np.array([os.getpid()])).tolist() if others == "ended" else None
    group = col.new_group(list(range(col.size()))) if call.startswith("group-") else None
    call = call.removeprefix("group-")
    count = 1 << 20 if call == "ring" else 100_000 if call.startswith("direct-") else 1000
    x = _ints(count, col.rank())
    late = 1
    timeout = (float(sys.argv[4]) if len(sys.argv) > 4 else 30) if col.rank() == late else 2
    lanes = {"lane-allreduce": lambda: col.allreduce(x), "lane-broadcast": lambda: col.broadcast(x, 0),
             "lane-allgather": lambda: col.allgather(x)}
    lanes.update({"direct-broadcast": lanes["lane-broadcast"], "direct-allgather": lanes["lane-allgather"],
                  "direct-allreduce": lanes["lane-allreduce"]})
    if call in lanes:
        from collectives.ops import express
        col.init(timeout=timeout)
        lanes[call]()   # (the first of its kind: the next one takes the lane,
        lanes[call]()   # which makes its exchange ready: on two ranks the late call is one function, ops.fused)
        w = col.world_group()
        assert (express.allreduce_lane(w, x, "sum", None) or express.broadcast_lane(w, x, 0)
                or express.allgather_lane(w, x, None)) is not None, "the lane did not open"
    else:
        col.barrier(group=group)
    do = (lambda: col.barrier(timeout=timeout, group=group)) if call == "barrier" else lanes[call] if call in lanes \
        else (lambda: col.allreduce(x, timeout=timeout, algorithm="ring" if call == "ring" else None, group=group))
    if col.rank() == late:
        if others == "ended":   # (no MPI call meanwhile: their words queue up behind their data, unread)
            await_ended([pid for r, pid in enumerate(pids) if r != late])
        else:
            await_cues([r for r in range(col.size()) if r != late])
    _late_rank_and_the_others(do, late, cue_late=others != "ended", staying=others == "staying")


def _late_rank_and_the_others(do, late: int, cue_late: bool = True, staying: bool = True) -> None:
    """Run the call ``do`` as "late call" on rank ``late`` and as "call" on the others (``report``);
    the others then cue the late rank (``cue_late``) and, ``staying``, live on until its call has
    ended (it cues them back), so that their give-up message tells it, not their farewells."""
    if col.rank() == late:
        try:
            report("late call", do)
        finally:
            if staying:
                for r in range(col.size()):
                    if r != late:
                        cue(r)
        return
    try:
        report("call", do)
    finally:
        if cue_late:
            cue(late)
        if staying:
            await_cue(late)


class _SteppedClock:
    """The calls' and lanes' clock on one rank (``stalled-in-a-lane-call``): 1 us a reading from the real
    one, and the time it stalled, so that every call of a tight loop comes back to back with its last
    on a machine of any speed (their deadlines stay ahead of the real clock: the run is short)."""

    def __init__(self):
        self.base, self.readings, self.stalled = time.monotonic(), 0, 0.0

    def __call__(self) -> float:
        self.readings += 1
        return self.base + self.readings * 1e-6 + self.stalled


class _StallingHeader(bytes):
    """A lane's header template whose formatting, in the call of number ``at``, waits for the other
    ranks' cues (they have timed out of that call) and adds the wait to ``clock``: a rank paused
    inside its call after it began and before its message left (by the system, a SIGSTOP, a signal
    handler that takes its time)."""

    def __new__(cls, template: bytes, at: int, clock: _SteppedClock):
        made = super().__new__(cls, template)
        made.at, made.clock = at, clock
        return made

    def __mod__(self, seq):
        if seq == self.at:
            began = time.monotonic()
            await_cues([r for r in range(col.size()) if r != col.rank()])
            self.clock.stalled += time.monotonic() - began
        return bytes.__mod__(self, seq)


def stalled_in_a_lane_call() -> None:
    """A tight loop of a small call on its express lane; rank 1 stalls inside its fourth call, after
    the call began and before its message left, until every other rank has timed out of it (timeout 2 s;
    rank 1's is 30). Rank 1 must fail that call too: a back-to-back call skips the look for a give-up
    only where the look comes within 0.1 ms of the last call's start (before, it was judged at the
    call's start, and rank 1 completed the call alone). argv[2]: "allreduce", "broadcast" or "allgather"."""
    from collectives.calls import call as call_module
    from collectives.ops import express, fused
    collective, late = sys.argv[2], 1
    x = _ints(4, col.rank())
    do = {"allreduce": lambda: col.allreduce(x), "broadcast": lambda: col.broadcast(x, 0),
          "allgather": lambda: col.allgather(x)}[collective]
    col.init(timeout=30 if col.rank() == late else 2)
    do()   # (the first of its kind: the next one takes the lane, which makes its exchange ready)
    do()
    w = col.world_group()
    lane = express.allreduce_lane(w, x, "sum", None) or express.broadcast_lane(w, x, 0) or \
        express.allgather_lane(w, x, None)
    assert lane is not None, "the lane did not open"
    if col.rank() == late:
        clock = _SteppedClock()
        for module in (call_module, express, fused):
            module.monotonic = clock
        lane.header = _StallingHeader(lane.header, w.seq + 4, clock)
    for _ in range(3):
        do()
    _late_rank_and_the_others(do, late)


def stalled_before_forwarding() -> None:
    """Three ranks, a small all-reduce on its lane (recursive doubling: rank 2 sends to rank 0, ranks 0
    and 1 exchange, rank 0 sends the result to rank 2). In the fourth call rank 0 stalls between its
    exchange with rank 1 and its message to rank 2, with no MPI call (a pause of the system's), until
    rank 2 has timed out of the call (timeout 2 s; the others' 30). Rank 1 has its result by then and
    has gone on to the next call, whose message waits at rank 0 ahead of rank 2's word that it gave
    up. Rank 0 must fail the call too: a call that lasted long reads every word at its end (one test
    found rank 1's message and missed the word, and rank 0 completed the call alone). Rank 1's call is
    over before anyone failed: it fails the next one, naming rank 0 or 2."""
    pids = col.allgather(np.array([os.getpid()])).tolist()
    failed_there = os.path.join(tempfile.gettempdir(), f"collectives-stalled-before-forwarding.{pids[0]}")
    done_here = failed_there + ".done"
    x = _ints(4, col.rank())
    col.init(timeout=2 if col.rank() == 2 else 30)
    col.allreduce(x)   # (the first of its kind: the next one takes the lane)
    col.allreduce(x)
    w = col.world_group()
    if col.rank() == 0:
        transport, target = w.transport, w.seq + 4
        exchange = transport.exchange

        def stalling(send, recv, bound, dest=None, source=None, reuse=None):
            if bound.seq == target and dest == 2 and source is None:
                await_file(failed_there, "rank 0", "rank 2's failure of the call")
            return exchange(send, recv, bound, dest, source, reuse)
        transport.exchange = stalling
    for _ in range(3):
        col.allreduce(x)
    try:
        report("call", col.allreduce, x)
        report("next call", col.allreduce, x)
    finally:
        if col.rank() == 2:
            open(failed_there, "w").close()
            await_file(done_here, "rank 2", "rank 0's end of the call")
            os.remove(failed_there)
            os.remove(done_here)
        elif col.rank() == 0:
            open(done_here, "w").close()


def late_on_a_part() -> None:
    """A group of ranks 0 and 1 of 3: rank 1 comes to the group's second call only once rank 0 has
    timed out of it and ended its program, and rank 2, outside the group, has ended its program
    too, so that their words at exit have queued up on rank 1 (run it under keep_survivors). Rank 1
    must fail the call too, not complete it with the data rank 0 had sent. Rank 2 also sends rank 1
    a few messages of its own while rank 0 waits in the call: they arrive after rank 0's data of the
    call and before its word that it gave up."""
    pids = col.allgather(np.array([os.getpid()])).tolist()
    g = col.new_group([0, 1])
    if col.rank() == 2:
        await_cue(0)
        for tag in range(8):
            col.send(np.zeros(4), dest=1, tag=tag)
        return
    x = _ints(1000, col.rank())
    g.allreduce(x)
    if col.rank() == 1:
        await_ended([pids[0], pids[2]])
        report("late call", g.allreduce, x, timeout=30)
    else:
        cue(2)   # (its data of the call leaves as the call starts, before rank 2 sees the cue)
        report("call", g.allreduce, x, timeout=2)


def slow_but_moving() -> None:
    """A large all-reduce whose every message is slow (each send waits 0.1 s, as over a slow link) takes
    longer than its timeout (1 s) in all, while data keeps moving: it must complete, right, on every
    rank; then a call in which one rank never comes still times out, naming it."""
    from ring.transport.mpi.transport import MPITransport
    send = MPITransport.send_to_right

    def slow_send(self, buf, bound):
        time.sleep(0.1)
        return send(self, buf, bound)
    MPITransport.send_to_right = slow_send
    x = _ints(1 << 18, col.rank())
    col.barrier()
    started = time.monotonic()
    result = report("slow call", col.allreduce, x, timeout=1.0, algorithm="ring")
    took = time.monotonic() - started
    right = np.array_equal(result, _expected_sum(1 << 18, col.size()))
    say(f"rank {col.rank()}: slow call {'right' if right else 'WRONG'}, longer than its timeout: {took > 1.0}")
    MPITransport.send_to_right = send
    col.barrier()
    if col.rank() == col.size() - 1:
        await_cues(range(col.size() - 1))
        return
    try:
        report("absent call", col.allreduce, x, timeout=1.0)
    finally:
        cue(col.size() - 1)


def never_starts_mpi() -> None:
    """Rank 1 (the launcher's PMI_RANK) imports the runtime but never starts MPI; it ends once it is
    the last of the launcher's processes on this host (its parent's other children have ended). The
    others' first call waits inside MPI_Init, which COLLECTIVES_TIMEOUT bounds: each must say so."""
    if os.environ.get("PMI_RANK") == "1":
        give_up = time.monotonic() + CUE_BOUND_S
        while _siblings() and time.monotonic() < give_up:
            time.sleep(0.05)
        say(f"rank 1: alone, ending {'' if not _siblings() else 'though not alone'}")
        return
    col.allreduce(np.ones(4, np.float32))
    say(f"rank {col.rank()}: MPI started after all")


def ends_without_mpi() -> None:
    """Rank 1 (the launcher's PMI_RANK) imports the runtime and ends its program at once, never
    starting MPI; the others' first call waits inside MPI_Init for it."""
    if os.environ.get("PMI_RANK") == "1":
        say("rank 1: ending without MPI")
        return
    col.allreduce(np.ones(4, np.float32))
    say(f"rank {col.rank()}: MPI started after all")


def _cue_once_left(ranks) -> None:
    """Cue ``ranks`` once this rank has left the runtime: its farewell said, it waits at exit for
    the others (as a rank that comes a while after one that ended finds it)."""
    from ring.transport.mpi.exits import Exits   # (imports MPI: here, not at import, so that "funneled" may start it)
    when_inside(Exits.exit_barrier, lambda: [cue(r) for r in ranks])


def _wait_for():
    """The MPI transport's poll loop (ring.transport.mpi.waiting): a call waiting for another rank is in it."""
    from ring.transport.mpi.waiting import wait_for   # (imports MPI: see _cue_once_left)
    return wait_for


def _ctrl_c() -> None:
    """Ctrl-C, to the main thread (a signal to the process may land on another thread, and the
    main thread then sees it only when its current wait ends)."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def crash_first() -> None:
    """Rank 1 raises before its first collective; the others are setting up."""
    if col.rank() == 1:
        raise OSError("cannot read the training data")
    report("first call", col.allreduce, _ints(10, col.rank()))


def census_other_call() -> None:
    """Ranks 0 and 1 call allreduce #2, rank 2 barrier #2 (both with timeout=2), rank 3 stays away
    until rank 2's call has ended: the census must tell the barrier from the all-reduce."""
    col.barrier()
    if col.rank() == 3:
        await_cue(2)
        return
    try:
        if col.rank() == 2:
            report("call 2", col.barrier, timeout=2)
        else:
            report("call 2", col.allreduce, np.ones(4, np.float32), timeout=2)
    finally:
        if col.rank() == 2:
            cue(3)


def absent_behind_a_waiting_rank() -> None:
    """Four ranks, recursive doubling: rank 3 stays away until the others' calls have ended. Rank 0
    times out first (2 s; the others 30 s), waiting for rank 2's message of the second step, which
    rank 2 cannot send while it waits for rank 3's of the first: the call waits for rank 3."""
    col.barrier()
    if col.rank() == 3:
        await_cues(range(3))
        return
    try:
        report("call 2", col.allreduce, np.ones(4, np.float32), timeout=2 if col.rank() == 0 else 30)
    finally:
        cue(3)


#: How long rank 2 of crash-first-late still loads its data after rank 1's raise: the time is the
#: property (longer than the 2 s grace of an exit after a failure, inside the 10 s a rank that left
#: before its first collective waits at exit to be heard).
LATE_S = 3


def crash_first_late() -> None:
    """Rank 1 raises before its first collective while rank 2 still loads its data, for LATE_S from
    rank 1's raise (cued)."""
    if col.rank() == 1:
        cue(2)
        raise OSError("cannot read the training data")
    if col.rank() == 2:
        await_cue(1)
        time.sleep(LATE_S)
    report("first call", col.allreduce, _ints(10, col.rank()))


def killed_mid_allreduce() -> None:
    """Rank 1 is SIGKILLed inside a large allreduce, after a first one (every pair connected), while
    the others are in it or on their way (argument: its elements, default 16 Mi: 64 MiB)."""
    x = np.ones(int(sys.argv[2]) if len(sys.argv) > 2 else 16 << 20, np.float32)
    if col.rank() == 0:
        say(f"algorithm: {col.algorithm_for('allreduce', x)}")
    col.allreduce(x, out=x, op="max")
    if col.rank() == 1:
        when_inside(Group.allreduce, lambda: os.kill(os.getpid(), signal.SIGKILL))
    started = time.monotonic()
    try:
        while time.monotonic() - started < 60:
            col.allreduce(x, out=x, op="max")
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError after {time.monotonic() - started:.1f} s: {e}")
        raise SystemExit(3)
    say(f"rank {col.rank()}: never noticed")


def uncaught() -> None:
    """Rank 1 raises an exception it does not catch, after 3 collectives."""
    _three_calls()
    if col.rank() == 1:
        raise RuntimeError("user bug on rank 1")
    _then_the_others_wait(1)


def uncaught_own_hook() -> None:
    """As ``uncaught``, where rank 1 put an excepthook of its own over the runtime's after its first
    collectives (a pretty-printer of tracebacks would)."""
    _three_calls()
    if col.rank() == 1:
        sys.excepthook = lambda kind, value, traceback: say(f"rank 1: own hook: {kind.__name__}")
        raise RuntimeError("user bug on rank 1")
    _then_the_others_wait(1)


def killed_between_calls() -> None:
    """Rank 1 is killed (SIGKILL) between two calls, after 3 collectives; the others wait in a fourth."""
    _three_calls()
    if col.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    _then_the_others_wait(1)


def handled_by_interpreter() -> None:
    """Rank 1 runs a line that raises in ``code.InteractiveInterpreter`` (which reports the error it
    handled through ``sys.excepthook``), then ends its program normally, after 3 collectives."""
    _three_calls()
    if col.rank() == 1:
        code.InteractiveInterpreter().runsource("1 / 0")
        return
    _then_the_others_wait(1)


def handled_under_own_hook() -> None:
    """As ``handled_by_interpreter``, where rank 1 put an excepthook of its own over the runtime's
    after its first collectives: the exception Python keeps of the handled one is no reason either."""
    _three_calls()
    if col.rank() == 1:
        sys.excepthook = lambda kind, value, traceback: say(f"rank 1: own hook: {kind.__name__}")
        code.InteractiveInterpreter().runsource("1 / 0")
        return
    _then_the_others_wait(1)


def exits() -> None:
    """Rank 1 calls sys.exit(0) after 3 collectives."""
    _three_calls()
    if col.rank() == 1:
        sys.exit(0)
    _then_the_others_wait(1)


def ctrl_c() -> None:
    """Rank 1 is hit by Ctrl-C (SIGINT) outside any collective, after 3 collectives."""
    _three_calls()
    if col.rank() == 1:
        signal.raise_signal(signal.SIGINT)   # (its handler runs before this returns: KeyboardInterrupt here)
    _then_the_others_wait(1)


#: How long the other ranks' programs go on after their MPI_Finalize in ``ctrl_c_as_the_others_finish``
#: (less than ``collectives.process.leaving.OUTLAST_SECONDS``).
FINISHING_S = 0.5


def ctrl_c_as_the_others_finish() -> None:
    """Rank 1 ends by an uncaught Ctrl-C after 3 collectives, while the others finalize MPI themselves
    (the runtime leaves inside it) and go on with their programs for FINISHING_S (writing results, say)."""
    _three_calls()
    rank = col.rank()
    if rank == 1:
        signal.raise_signal(signal.SIGINT)
    from mpi4py import MPI
    MPI.Finalize()
    time.sleep(FINISHING_S)
    say(f"rank {rank}: its program ended, {FINISHING_S} s after MPI_Finalize")


def interrupted_as_it_ends() -> None:
    """Ctrl-C lands on rank 1 as its 4th small allreduce ends, as numpy's error state is restored, after
    the data has moved on every rank (argv[2] "lane": the express lane's call, of the kind the first
    three opened and made ready: on two ranks the lane's one function; "usual": with an option); rank
    1 catches it and calls again with the same data, as a program that retries an interrupted step
    would. Its runtime must be stopped (the next call raises), never pairing the retry with the
    others' next call."""
    from collectives.ops import express
    from ring import arrays
    lane = sys.argv[2] == "lane"
    options = {} if lane else {"timeout": 60}
    count = 1000 if lane else 100   # (the lane: the kind of _three_calls)
    restore, armed = arrays.restore_floating_point, []

    def interrupted_once(token):   # (the call's end restores numpy's error state: the signal comes there)
        restore(token)
        if armed:
            armed.clear()
            signal.raise_signal(signal.SIGINT)
    if col.rank() == 1:   # (set before the lanes take it: the lane binds it at import, its one function when made)
        arrays.restore_floating_point = express._restore_floating_point = interrupted_once
    _three_calls()
    if lane:
        assert express.allreduce_lane(col.world_group(), _ints(count, col.rank()), "sum", None) is not None, \
            "the lane did not open"
    armed.append(True)
    _steps_retried_after_ctrl_c(count, options)


def interrupted_as_the_turn_is_taken() -> None:
    """Ctrl-C lands on rank 1 right after its 4th small allreduce takes the engine's turn (argv[2]
    "lane": the express lane, on two ranks its one function, which takes it without the engine's
    lock; "usual": with an option, in ``run_now``); rank 1 catches it and calls again. The turn must
    go back (else its next call and its exit wait for ever) and the runtime stop (the next call
    raises): the others fail that call, naming rank 1."""
    lane = sys.argv[2] == "lane"
    options = {} if lane else {"timeout": 60}
    count = 1000 if lane else 100

    class TakenThenInterrupted(dict):   # (the engine's turn, whose take is followed by a Ctrl-C once armed)
        armed = False

        def setdefault(self, key, default=None):
            holder = super().setdefault(key, default)
            if TakenThenInterrupted.armed and holder == default:
                TakenThenInterrupted.armed = False
                signal.raise_signal(signal.SIGINT)   # (handled at once: here, right after the take)
            return holder
    engine = col.world_group().runtime.engine
    if col.rank() == 1:   # (before the lane's one function binds it)
        engine.turn = TakenThenInterrupted()
    _three_calls()
    TakenThenInterrupted.armed = True
    _steps_retried_after_ctrl_c(count, options)
    say(f"rank {col.rank()}: the turn is {'handed back' if not engine.turn else f'held: {engine.turn}'}")


def _steps_retried_after_ctrl_c(count: int, options: dict) -> None:
    """Steps 3 to 5, each an allreduce of ``count`` integers called again after a KeyboardInterrupt;
    the first CollectiveError ends them. Each says how it went."""
    for step in range(3, 6):
        x = _ints(count, col.rank(), step)
        for attempt in ("first", "again"):
            try:
                result = col.allreduce(x, **options)
            except KeyboardInterrupt:
                say(f"rank {col.rank()}: KeyboardInterrupt in step {step}")
                continue   # (the same step again)
            except col.CollectiveError as e:
                say(f"rank {col.rank()}: CollectiveError in step {step} ({attempt}): {e}")
                return
            right = np.array_equal(result, _expected_sum(count, col.size(), step))
            say(f"rank {col.rank()}: step {step} {'right' if right else 'WRONG DATA'}")
            break


def skipped() -> None:
    """Rank 1 skips the last step of a loop of identical calls, then ends its program."""
    steps = 4 if col.rank() == 1 else 5
    for step in range(steps):
        report(f"step {step}", col.allreduce, _ints(1000, col.rank()))


def skipped_named() -> None:
    """As skipped, but rank 1 skips step 2 in the middle, and each call is named after its step."""
    for step in range(5):
        if col.rank() == 1 and step == 2:
            continue
        report(f"step {step}", col.allreduce, _ints(1000, col.rank()), name=f"grad step {step}")


def interrupted() -> None:
    """Ctrl-C lands on rank 1 inside a small allreduce, while it waits there for the others; they
    come only once rank 1 has left (cued: the call cannot finish before), and fail the call it gave
    up; rank 1 catches it, finds the runtime stopped, and ends cleanly."""
    _three_calls()
    x = _ints(100, col.rank())
    if col.rank() == 1:
        when_inside(_wait_for(), _ctrl_c)
        _cue_once_left([r for r in range(col.size()) if r != 1])
        try:
            col.allreduce(x)
            say("rank 1: the allreduce was not interrupted")
        except KeyboardInterrupt:
            say("rank 1: KeyboardInterrupt inside the allreduce")
        try:
            col.allreduce(x)
        except col.CollectiveError as e:
            say(f"rank 1: then CollectiveError: {e}")
        return   # a clean exit
    await_cue(1)
    try:
        result = col.allreduce(x)
        right = np.array_equal(result, _expected_sum(100, col.size()))
        say(f"rank {col.rank()}: the interrupted call returned {'the right sum' if right else 'WRONG DATA'}")
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError in the interrupted call: {e}")
        raise SystemExit(3)
    report("the next call", col.allreduce, x)


def finalize() -> None:
    """The program finalizes MPI itself at the end (or tells mpi4py not to), as some do."""
    how = sys.argv[2]
    if how != "by-hand":
        import mpi4py
        setattr(mpi4py.rc, how.split("=")[0], False)
    from mpi4py import MPI
    x = _ints(1000, col.rank())
    result = col.allreduce(x)
    say(f"rank {col.rank()}: sum {'right' if np.array_equal(result, _expected_sum(1000, col.size())) else 'WRONG'}")
    if how == "by-hand":
        MPI.Finalize()
    say(f"rank {col.rank()}: done")


def settings_differ() -> None:
    """A wire setting differs between ranks: in the environment, or given to init."""
    what = sys.argv[2]
    rank = col.rank()   # local: sets nothing up
    if what == "segment":
        os.environ["COLLECTIVES_SEGMENT_BYTES"] = "64K" if rank == 1 else str(4 << 20)
        report("first call", col.broadcast, np.zeros(3_000_000, np.float32))
    elif what == "check":
        report("init", col.init, check=rank != 1)
    elif what == "bad-env":
        if rank == 1:
            os.environ["COLLECTIVES_TIMEOUT"] = "soon"
        report("first call", col.allreduce, np.ones(10, np.float32))
    elif what == "huge-segment":
        os.environ["COLLECTIVES_SEGMENT_BYTES"] = str(1 << 40)
        report("first call", col.allreduce, np.ones(10, np.float32))


def unchecked() -> None:
    """With the check off, the ranks disagree and a message is longer than expected: rank 1 passes one
    element more ("sizes"); rank 1 forces halving where rank 0 forces doubling, after three calls that
    agreed ("algorithms"); rank 1's broadcast buffer is one element short, and the root ends its
    program after its part ("broadcast": the receiver must not blame the root's leaving); rank 0 calls
    another collective than the others, who complete theirs and end ("collectives")."""
    kind = sys.argv[2] if len(sys.argv) > 2 else "sizes"
    col.init(check=False)
    if kind == "sizes":
        count = 300_000 + (1 if col.rank() == 1 else 0)
        report("allreduce", col.allreduce, np.ones(count, np.float32), timeout=5)
    elif kind == "algorithms":
        x = np.ones(16, np.float32)
        for _ in range(3):
            col.allreduce(x, algorithm="doubling")
        report("allreduce", col.allreduce, x, algorithm="doubling" if col.rank() == 0 else "halving")
    elif kind == "broadcast":
        x = np.ones(70_000, np.float32)
        for _ in range(3):
            col.broadcast(x, algorithm="ring")
        report("broadcast", col.broadcast, np.ones(70_000 - col.rank(), np.float32), algorithm="ring")
    else:   # ("collectives": rank 0 all-reduces by the ring, the others reduce-scatter, and end their programs)
        x = np.ones(100_000, np.float32)
        if col.rank() == 0:
            report("allreduce", col.allreduce, x, algorithm="ring", timeout=2)
        else:
            report("reduce_scatter", col.reduce_scatter, x, algorithm="ring")


def rank_only() -> None:
    """Rank 0 asks for rank() and size(), the others not; then everyone works together. The others
    come to the call only once rank 0 has its answers (cued): rank() and size() need no other rank."""
    if col.rank() == 0:
        say(f"rank 0: size {col.size()}")
        for other in range(1, col.size()):
            cue(other)
    else:
        await_cue(0)
    result = report("allreduce", col.allreduce, _ints(1000, col.rank()))
    assert np.array_equal(result, _expected_sum(1000, col.size()))


def threads() -> None:
    """Two threads of every rank call allreduce at once, each on its own data, many times."""
    count, calls = 1 << 20, 12
    outcomes = {"right": 0, "refused": 0, "wrong": 0}
    lock = threading.Lock()

    def work(salt: int) -> None:
        x = _ints(count, col.rank(), salt)
        expected = _expected_sum(count, col.size(), salt)
        for _ in range(calls):
            try:
                outcome = "right" if np.array_equal(col.allreduce(x, timeout=60), expected) else "wrong"
            except col.CollectiveUsageError as e:
                assert "calling thread differs across ranks" in str(e), str(e)
                outcome = "refused"
            with lock:
                outcomes[outcome] += 1

    workers = [threading.Thread(target=work, args=(salt,), name=f"worker-{salt}") for salt in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    say(f"rank {col.rank()}: threads {outcomes}")


def first_from_threads() -> None:
    """Threads of every rank make the process's first calls into the runtime (``rank()`` and ``size()``,
    which start MPI), one every 5 ms, so that some come while another is inside MPI's start: each
    gets the answer, none sees MPI half started."""
    answers, start = [], threading.Barrier(16)

    def ask(after: float) -> None:
        start.wait()
        time.sleep(after)
        try:
            answers.append((col.rank(), col.size()))
        except Exception as error:
            answers.append(repr(error))

    askers = [threading.Thread(target=ask, args=(i / 200,)) for i in range(16)]
    for a in askers:
        a.start()
    for a in askers:
        a.join()
    result = report("allreduce", col.allreduce, _ints(1000, col.rank()))
    assert np.array_equal(result, _expected_sum(1000, col.size()))
    say(f"rank {col.rank()}: answers {sorted(set(map(str, answers)))}")


def funneled() -> None:
    """The program started MPI with MPI_THREAD_FUNNELED: a collective from another thread is refused
    on that thread alone, and the main thread's calls still work."""
    import mpi4py
    mpi4py.rc.thread_level = "funneled"
    outcome = []

    def from_a_thread():
        try:
            col.allreduce(_ints(10, col.rank()), timeout=10)
            outcome.append("ran")
        except col.CollectiveUsageError as e:
            outcome.append(str(e))

    col.barrier()
    worker = threading.Thread(target=from_a_thread, name="loader")
    worker.start()
    worker.join()
    say(f"rank {col.rank()}: from a thread: {outcome[0]}")
    result = col.allreduce(_ints(10, col.rank()))
    say(f"rank {col.rank()}: from the main thread: "
         f"{'right' if np.array_equal(result, _expected_sum(10, col.size())) else 'WRONG'}")


#: How long rank 1 of idle stays away from rank 0's wait: the time over which the wait's CPU is measured.
AWAY_S = 4


def idle() -> None:
    """Rank 0 waits in an allreduce for rank 1, which stays away AWAY_S from the start of that wait
    (cued): how much of a core does the wait take?"""
    if col.rank() == 1:
        await_cue(0)
        time.sleep(AWAY_S)
    cpu, wall = time.process_time(), time.monotonic()
    if col.rank() == 0:
        cue(1)
    col.allreduce(np.ones(10, np.float32))
    if col.rank() == 0:
        say(f"rank 0: waited {time.monotonic() - wall:.2f} s using {time.process_time() - cpu:.2f} s of CPU")


def async_absent() -> None:
    """The last rank never issues the call; the others' handles raise from wait, bounded by the
    call's timeout= or by wait(timeout=) (argv[2]: "call" or "wait"), and the next call refuses."""
    col.barrier()
    last = col.size() - 1
    if col.rank() == last:
        await_cues(range(last))   # (until the others' waits ended)
        say(f"rank {col.rank()}: stayed away")
        return
    bound = {"call": {"timeout": 2}, "wait": {}}[sys.argv[2]]
    work = col.allreduce(_ints(1000, col.rank()), async_op=True, **bound)
    try:
        report("wait", work.wait, **({"timeout": 2} if sys.argv[2] == "wait" else {}))
    finally:
        cue(last)


def async_uncaught() -> None:
    """Rank 1 raises an uncaught exception with handles in flight (rank 0 issues its own only once
    rank 1 is about to raise, cued, so they cannot have finished); the others wait on theirs."""
    _three_calls()
    if col.rank() == 0:
        await_cue(1)
    works = [col.allreduce(_ints(300_000, col.rank()), async_op=True) for _ in range(3)]
    if col.rank() == 1:
        cue(0)
        raise RuntimeError("user bug on rank 1")
    for k, work in enumerate(works):
        report(f"wait {k}", work.wait)


def async_ctrl_c() -> None:
    """Ctrl-C lands on rank 1 while it waits for a handle: wait raises KeyboardInterrupt, the
    runtime stops, and the other ranks hear why at once: rank 2, waiting since before; rank 0
    issues its call only once rank 2's wait has ended (cued: with rank 0 there, rank 2 could
    finish from what rank 1 sent before it stopped). 3 ranks."""
    _three_calls()
    if col.rank() == 0:
        await_cue(2)
    if col.rank() == 1:
        # Ctrl-C lands in the call, run by the waiting thread (Engine.help) and waiting there for
        # rank 0: kept from the engine thread, which takes a call 200 us old, since a call it ran
        # went on there after the Ctrl-C and finished once rank 0 came, however late.
        progress._PICKUP_SECONDS = 3600.0
        when_inside(_wait_for(), _ctrl_c)
    work = col.allreduce(_ints(1000, col.rank()), async_op=True)
    if col.rank() == 1:
        try:
            work.wait()
            say("rank 1: the wait was not interrupted")
        except KeyboardInterrupt:
            say("rank 1: KeyboardInterrupt inside wait")
        try:
            col.allreduce(_ints(10, 1))
        except col.CollectiveError as e:
            say(f"rank 1: then CollectiveError: {e}")
        return
    try:
        right = np.array_equal(report("wait", work.wait), _expected_sum(1000, col.size()))
    finally:
        if col.rank() == 2:
            cue(0)
    say(f"rank {col.rank()}: sum {'right' if right else 'WRONG'}")


def async_dropped_at_exit() -> None:
    """Rank 0 issues two calls and ends its program without waiting for them; the other ranks
    wait for theirs: the runtime finishes rank 0's calls at exit, so the others get the right sums."""
    works = [col.allreduce(_ints(200_000, col.rank(), salt), async_op=True) for salt in (1, 2)]
    if col.rank() == 0:
        say("rank 0: leaving without waiting")
        return
    for salt, work in zip((1, 2), works):
        right = np.array_equal(report(f"wait {salt}", work.wait), _expected_sum(200_000, col.size(), salt))
        say(f"rank {col.rank()}: sum {salt} {'right' if right else 'WRONG'}")


def late_other_call() -> None:
    """Ranks 0 and 2 have async all-reduces in flight when they time out waiting for rank 1, which
    then (cued by both) comes with a call of another size: it finds the others' abandoned messages
    disagree, and the others have left. Every rank must still end (each rank's error, then exit),
    none hang. Rank 1's own timeout is long: an error that names a rank that left came by message."""
    col.barrier()
    if col.rank() == 1:
        await_cues([0, 2])
        report("late call", col.allreduce, _ints(4, 1), timeout=30)
        return
    works = [col.allreduce(_ints(1000, col.rank(), salt), async_op=True, timeout=2) for salt in (1, 2)]
    try:
        for k, work in enumerate(works):
            report(f"wait {k}", work.wait)
    finally:
        cue(1)


def timeline() -> None:
    """Every collective, blocking and async, small and large, with a program span, under
    COLLECTIVES_TIMELINE; argv[2] "fail": rank 1 then raises an uncaught exception."""
    big, small = _ints(300_000, col.rank()), _ints(100, col.rank())
    with col.timeline.span("my step", step=1):
        col.allreduce(big)
        works = [col.allreduce(small, async_op=True), col.reduce_scatter(big, async_op=True)]
        col.allgather(big)
        col.broadcast(big.copy(), root=0)
        col.barrier()
        for work in works:
            work.wait()
    if sys.argv[2] == "fail" and col.rank() == 1:
        raise RuntimeError("user bug on rank 1")
    col.allreduce(small, name="last")


def group_absent() -> None:
    """In group [1, 2] of 3 ranks, rank 2 never comes to the group's allreduce: rank 1 times out
    naming world rank 2 (its rank 1 in the group) and the group; then its world call is refused.
    The others end their programs only once rank 1's group call has ended (cued)."""
    group = col.new_group([1, 2])
    if col.rank() != 1:
        await_cue(1)
        return
    try:
        report("group call", group.allreduce, _ints(1000, 1), timeout=2)
    except SystemExit:
        report("world call after", col.barrier)   # the runtime has stopped on this rank, for every group
    finally:
        for other in (0, 2):
            cue(other)


def world_call_during_a_groups() -> None:
    """Of 3 ranks, rank 1 waits in group [1, 2]'s allreduce (rank 2 comes to it only on rank 0's cue)
    while rank 0 times out in the world's: its census hears neither, and must not say they are in no call."""
    group = col.new_group([1, 2])
    if col.rank() == 0:
        try:
            report("world call", col.allreduce, _ints(10, 0), timeout=2)
        finally:
            cue(2)
    elif col.rank() == 2:
        await_cue(0)
        report("group call", group.allreduce, _ints(1000, 2))
    else:
        report("group call", group.allreduce, _ints(1000, 1), timeout=20)


def group_member_dies() -> None:
    """Rank 2 raises an uncaught exception after one call on group [1, 2]; rank 1 waits for it in
    the group's next call, rank 0 in the world's."""
    group = col.new_group([1, 2])
    if group:
        group.allreduce(_ints(1000, col.rank()))
    if col.rank() == 2:
        raise RuntimeError("user bug on rank 2")
    if group:
        report("group call 2", group.allreduce, _ints(1000, col.rank()))
    else:
        report("world call", col.barrier)


def group_partial() -> None:
    """Ranks 0 and 1 make a group; the last rank never calls new_group and ends its program."""
    col.barrier()
    if col.rank() == col.size() - 1:
        return
    report("new_group", col.new_group, [0, 1])


def group_member_left() -> None:
    """Ranks 0 and 1 make a group of every rank by its members alone; the last rank, listed, ended
    its program instead (it can never come: they must say so at once, not at the timeout)."""
    col.barrier()
    if col.rank() == col.size() - 1:
        return
    report("new_group", col.new_group, list(range(col.size())), members_only=True, timeout=30)


def group_comm() -> None:
    """init(comm=) with each half of the world (split by mpi4py): the runtime's world is the half."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    col.init(comm=half)
    x = _ints(100_000, world.Get_rank())
    expected = np.empty_like(x)
    half.Allreduce(x, expected)
    ours = col.allreduce(x)
    say(f"rank {world.Get_rank()}: runtime rank {col.rank()} of {col.size()}, half rank {half.Get_rank()} of "
         f"{half.Get_size()}, allreduce {'right' if np.array_equal(ours, expected) else 'WRONG'}")
    try:
        col.init(comm=world)
    except col.CollectiveUsageError as e:
        say(f"rank {world.Get_rank()}: second init: {e}")
    col.init(comm=half)   # the same ranks: nothing to change
    if world.Get_rank() == 0:
        try:
            col.init(comm="world")
        except col.CollectiveUsageError as e:
            say(f"rank 0: bad comm: {e}")


if __name__ == "__main__":
    {"absent": absent, "stuck": stuck, "late": late, "killed": killed_mid_allreduce, "uncaught": uncaught,
     "uncaught-own-hook": uncaught_own_hook, "handled-by-interpreter": handled_by_interpreter, "exits": exits,
     "handled-under-own-hook": handled_under_own_hook,
     "killed-between-calls": killed_between_calls,
     "ctrl-c": ctrl_c, "ctrl-c-as-the-others-finish": ctrl_c_as_the_others_finish, "skipped": skipped, "skipped-named": skipped_named, "interrupted": interrupted,
     "interrupted-as-it-ends": interrupted_as_it_ends,
     "interrupted-as-the-turn-is-taken": interrupted_as_the_turn_is_taken,
     "finalize": finalize, "settings": settings_differ, "rank-only": rank_only, "threads": threads,
     "first-from-threads": first_from_threads,
     "idle": idle, "crash-first": crash_first, "crash-first-late": crash_first_late,
     "census-other-call": census_other_call, "absent-behind-a-waiting-rank": absent_behind_a_waiting_rank,
     "retry-at-setup": retry_at_setup, "late-to-setup": late_to_setup,
     "absent-at-setup": absent_at_setup, "farewell-alone": farewell_alone, "unchecked": unchecked,
     "funneled": funneled, "async-absent": async_absent, "async-uncaught": async_uncaught,
     "async-ctrl-c": async_ctrl_c, "async-dropped-at-exit": async_dropped_at_exit,
     "late-other-call": late_other_call, "late-after-timeout": late_after_timeout,
     "late-with-no-pause": late_with_no_pause, "stalled-in-a-lane-call": stalled_in_a_lane_call,
     "stalled-before-forwarding": stalled_before_forwarding,
     "slow-but-moving": slow_but_moving, "never-starts-mpi": never_starts_mpi, "ends-without-mpi": ends_without_mpi,
     "late-on-a-part": late_on_a_part, "stuck-beside-a-part": stuck_beside_a_part,
     "timeline": timeline, "group-absent": group_absent, "world-call-during-a-groups": world_call_during_a_groups,
     "group-member-dies": group_member_dies,
     "group-partial": group_partial, "group-member-left": group_member_left, "group-comm": group_comm}[sys.argv[1]]()
