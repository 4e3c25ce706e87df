"""Issue 24's scenarios for tests/test_edges.py, each run as a user's program:
``mpiexec -n N python -m tests.programs.edges SCENARIO [ARG]``. Ranks print how they ended,
one whole line each: ``rank R: CollectiveError after T s in LABEL: message``, ``rank R: ...``."""
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

import collectives as col
from collectives.groups.group import Group
from tests.programs.cues import await_cue, await_cues, await_file, await_ended, cue, report, say, when_inside


def p2p_mismatch() -> None:
    """Rank 0 sends 4 float64 (tag 3); rank 1 receives into a buffer that does not fit (argv[2]:
    "larger": 8 float64, "dtype": 8 int32, the same 32 bytes, "shorter": 2 float64)."""
    col.barrier()
    if col.rank() == 0:
        report("send", col.send, np.arange(4.0), dest=1, tag=3, timeout=10)
    elif col.rank() == 1:
        buffer = {"larger": np.full(8, -1.0), "dtype": np.full(8, -1, np.int32),
                  "shorter": np.full(2, -1.0)}[sys.argv[2]]
        try:
            report("recv", col.recv, buffer, source=0, tag=3, timeout=10)
        finally:
            say(f"rank 1: buffer {'untouched' if np.all(buffer == -1) else 'WRITTEN'}")


#: How late rank 2 does its part, after rank 0 cued it from its wait: more than that wait's first looks at
#: the control channel (``ring.transport.mpi.waiting.CHECK_INTERVAL``), which read rank 1's farewell.
LATE_PART_S = 1.0


def p2p_after_an_end() -> None:
    """Rank 1 does its whole part of rank 0's point-to-point messages and ends its program; rank 2 does
    its part LATE_PART_S after rank 0 cued it, with rank 0 inside the wait meanwhile. argv[2] "any": rank 0
    receives twice from any rank (rank 1 sends at once); "raises": the same, but rank 2 raises instead
    of sending; "sends": rank 0 sends argv[3] float64 to ranks 1 and 2 and waits for both (rank 1
    receives at once); "nobody": rank 0 receives from any rank, and ranks 1 and 2 end their programs
    without sending."""
    col.barrier()
    rank, count = col.rank(), int(sys.argv[3]) if len(sys.argv) > 3 else 4
    if sys.argv[2] == "nobody":
        if rank == 0:
            report("receive", col.recv, np.empty(4), None, 1, timeout=20)
    elif sys.argv[2] in ("any", "raises"):
        if rank == 0:
            first = np.empty(4)
            report("first receive", col.recv, first, None, 1, timeout=10)
            cue(2)
            second = np.empty(4)
            source = report("second receive", col.recv, second, None, 1, timeout=10)
            say(f"rank 0: the second came from rank {source}, {'right' if np.all(second == source) else 'WRONG'}")
        else:
            if rank == 2:
                await_cue(0)
                time.sleep(LATE_PART_S)
                if sys.argv[2] == "raises":
                    raise RuntimeError("a bug on rank 2")
            report("send", col.send, np.full(4, float(rank)), 0, 1, timeout=10)
    elif rank == 0:
        requests = [col.isend(np.full(count, float(peer)), peer, 1) for peer in (1, 2)]
        cue(2)
        report("sends", col.wait_all, requests, timeout=10)
    else:
        if rank == 2:
            await_cue(0)
            time.sleep(LATE_PART_S)
        got = np.empty(count)
        report("receive", col.recv, got, 0, 1, timeout=10)
        say(f"rank {rank}: received {'right' if np.all(got == rank) else 'WRONG'}")


def p2p_in_flight() -> None:
    """Rank 1 starts sending rank 0 argv[2] float64 (tag 2) and ends its program without waiting for the
    send; rank 0 receives it (argv[3] "any": from any rank, else from rank 1). Across a slow link the
    message is still on its way when rank 1's farewell comes."""
    col.barrier()
    count = int(sys.argv[2])
    if col.rank() == 1:
        col.isend(np.full(count, 1.0), 0, 2)
    elif col.rank() == 0:
        got = np.empty(count)
        report("receive", col.recv, got, None if sys.argv[3] == "any" else 1, 2, timeout=60)
        say(f"rank 0: received {'right' if np.all(got == 1.0) else 'WRONG'}")


def p2p_after_in_flight() -> None:
    """Rank 0 starts sending rank 1 4 MiB (tag 1) and ends its program without waiting for the send;
    rank 1 takes it LATE_PART_S later (after rank 0's farewell), then waits for a message with tag 2
    that rank 0 never sent, from rank 0 (argv[2] "from-0") or from any rank ("any")."""
    col.barrier()
    if col.rank() == 0:
        col.isend(np.full(1 << 19, 1.0), 1, 1)
    elif col.rank() == 1:
        time.sleep(LATE_PART_S)
        got = np.empty(1 << 19)
        report("receive", col.recv, got, 0, 1, timeout=20)
        say(f"rank 1: received {'right' if np.all(got == 1.0) else 'WRONG'}")
        report("second receive", col.recv, np.empty(4), None if sys.argv[2] == "any" else 0, 2, timeout=20)


def killed() -> None:
    """Rank 1 (argv[3], if given) is killed (SIGKILL) after a first call, once every other rank has
    cued it: from inside its second call (argv[2] "waiting"), or from outside the runtime, where it
    then computes until the victim's process has ended ("computing": one host only). Each survivor
    prints its pid, its error if any, and when its program ended (time.monotonic())."""
    from mpi4py import MPI
    victim = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    say(f"rank {col.rank()}: pid {os.getpid()}")
    pids = MPI.COMM_WORLD.allgather(os.getpid())
    x = np.ones(1000, np.float32)
    for _ in range(3):   # every pair connected before the death (a death during MPI's start is another story)
        col.allreduce(x)
        col.barrier()
    if col.rank() == victim:
        await_cues(r for r in range(col.size()) if r != victim)
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "waiting":
        when_inside(Group.allreduce, lambda: cue(victim))
        try:
            report("call 2", col.allreduce, x, timeout=30)
        except SystemExit:
            pass
    else:
        cue(victim)
        await_ended([pids[victim]])
    say(f"rank {col.rank()}: program ended at {time.monotonic():.3f}")


def killed_async() -> None:
    """Rank argv[2] is SIGKILLed 0.2 s into 20 async all-reduces of 16 MB each, in flight on every
    rank (across hosts: the two-level all-reduce's reduce-scatter sends to it meanwhile)."""
    victim = int(sys.argv[2])
    say(f"rank {col.rank()}: pid {os.getpid()}")
    col.allreduce(np.ones(1000, np.float32))
    col.barrier()
    if col.rank() == victim:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
    x = np.full(4 << 20, col.rank() + 1.0, np.float32)
    works = [col.allreduce(x, async_op=True, timeout=30) for _ in range(20)]
    try:
        for i, work in enumerate(works):
            report(f"work {i}", work.wait)
    except SystemExit:
        pass
    say(f"rank {col.rank()}: program ended at {time.monotonic():.3f}")


def terminated_before_setup() -> None:
    """Rank 1 is terminated (SIGTERM, Python's default: the process ends at once) before its first
    collective, once every other rank waits in theirs (the runtime's setup): each says so by a file
    in the directory argv[2], so that rank 1 uses no MPI before it dies. (Cued from the call's
    start instead, before the setup's wait, the launcher killed the survivors in most runs.)"""
    cues, me = Path(sys.argv[2]), col.rank()
    if me == 1:
        others = [cues / f"inside.{r}" for r in range(col.size()) if r != 1]
        give_up = time.monotonic() + 30
        while not all(p.exists() for p in others) and time.monotonic() < give_up:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
    from ring.transport.mpi import setup   # (imported once MPI runs)
    when_inside(setup._wait_setup, lambda: (cues / f"inside.{me}").touch())
    report("first call", col.allreduce, np.ones(10), timeout=30)


def ended_early() -> None:
    """Rank 1 ends its program normally before its first collective; the others call one."""
    if col.rank() == 1:
        say("rank 1: ends")
        return
    report("first call", col.allreduce, np.ones(10), timeout=30)


def interrupted_in_setup() -> None:
    """Rank 1's first collective is interrupted inside the setup, after MPI started and before the rank
    sent anything (a Ctrl-C landing there: the launcher's query raises KeyboardInterrupt, once); its
    program catches it and ends. The others call one."""
    if col.rank() == 1:
        from collectives.process import startup
        asked = startup.launchers.started_under_proxy

        def interrupted() -> int:
            startup.launchers.started_under_proxy = asked
            raise KeyboardInterrupt
        startup.launchers.started_under_proxy = interrupted
        try:
            col.allreduce(np.ones(10), timeout=30)
        except KeyboardInterrupt:
            say("rank 1: interrupted in its setup, ends")
        return
    report("first call", col.allreduce, np.ones(10), timeout=30)


def never_used() -> None:
    """No rank makes a collective: each asks only its rank (which counts as a use: the exit hooks are
    installed, and every rank joins one setup exchange at exit, which must end cleanly)."""
    say(f"rank {col.rank()}: done at {time.monotonic():.3f}")


def groups_in_a_loop() -> None:
    """new_group in a loop until MPI runs out of communicators, then destroy some and go on."""
    made = []
    try:
        while len(made) < 5000:
            made.append(col.new_group(range(col.size())))
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError after {len(made)} groups: {e}")
    for group in made[:100]:
        group.destroy()
    pair = col.new_group([0, col.size() - 1])
    total = pair.allreduce(np.ones(2)) if pair else None
    say(f"rank {col.rank()}: after destroying 100: {'sum right' if total is None or total[0] == 2 else 'WRONG'}, "
         f"world {'right' if col.allreduce(np.ones(1))[0] == col.size() else 'WRONG'}")
    for group in made[100:]:
        group.destroy()
    for _ in range(2100):   # more than MPI has: each destroyed group gives its communicator back
        group = col.new_group(range(col.size()))
        group.barrier()
        group.destroy()
    try:
        group.barrier()
    except col.CollectiveUsageError as e:
        say(f"rank {col.rank()}: then: {e}")
    say(f"rank {col.rank()}: 2100 groups made and destroyed")


def hosts() -> None:
    """Where each rank runs, as the runtime sees it, and a 4 MiB all-reduce's result."""
    import socket
    total = col.allreduce(np.full(1 << 20, col.rank() + 1.0, np.float32))
    right = np.all(total == col.size() * (col.size() + 1) / 2)
    say(f"rank {col.rank()}: host {socket.gethostname()} local {col.local_rank()}/{col.local_size()} "
         f"sum {'right' if right else 'WRONG'}")


def vanished() -> None:
    """Every rank says it is ready, then waits until the test has taken host 2 off the network and
    killed its processes (the test then makes the file argv[3]) and calls an all-reduce with
    ``timeout=`` argv[2] seconds."""
    x = np.ones(1000, np.float32)
    for _ in range(3):
        col.allreduce(x)
    col.barrier()
    say(f"rank {col.rank()}: pid {os.getpid()} ready")
    await_file(sys.argv[3], f"rank {col.rank()}", "host 2's end")
    try:
        report("the call after", col.allreduce, x, timeout=float(sys.argv[2]))
    except SystemExit:
        pass
    say(f"rank {col.rank()}: program ended at {time.monotonic():.3f}")


def raw_count() -> None:
    """Run with the check off: rank 0 broadcasts 16000 raw bytes whose byte 257 is argv[2] (where a
    doubling message cut in pieces says how many follow) while rank 1 all-reduces 4000 float32; then
    both make three matching all-reduces of 4000 float32 (16 KiB: cut). Each rank says how each of
    those ended: raised, right or WRONG."""
    rank = col.rank()
    raw = np.zeros(16000, np.uint8)
    raw[257] = int(sys.argv[2])
    try:
        col.broadcast(raw, root=0, timeout=3) if rank == 0 else col.allreduce(np.ones(4000, np.float32), timeout=3)
    except (col.CollectiveError, col.CollectiveUsageError):
        pass
    for k in range(3):
        x = np.full(4000, 10.0 * k + rank, np.float32)
        try:
            total = col.allreduce(x, timeout=3)
        except (col.CollectiveError, col.CollectiveUsageError) as e:
            say(f"rank {rank}: call {k} raised {type(e).__name__}")
            continue
        say(f"rank {rank}: call {k} {'right' if np.all(total == 20.0 * k + 1) else 'WRONG'}")


if __name__ == "__main__":
    {"p2p-mismatch": p2p_mismatch, "p2p-after-an-end": p2p_after_an_end, "p2p-in-flight": p2p_in_flight, "p2p-after-in-flight": p2p_after_in_flight, "killed": killed, "killed-async": killed_async, "terminated-before-setup": terminated_before_setup, "ended-early": ended_early,
     "interrupted-in-setup": interrupted_in_setup, "never-used": never_used,
     "groups-in-a-loop": groups_in_a_loop, "hosts": hosts, "vanished": vanished, "raw-count": raw_count}[sys.argv[1]]()
