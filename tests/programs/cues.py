"""What the test programs wait on instead of sleeping: a cue from another rank (a message on
MPI_COMM_WORLD), the end of other processes, a file another process writes, the main thread
inside a given function. Every wait is bounded by CUE_BOUND_S, and a cue that never comes ends
the program with status 4, saying which. Nothing here imports MPI or ``collectives`` at the top:
``tests/programs/hooks.py`` looks at what importing them installs."""
import inspect
import os
import sys
import threading
import time

#: Cues between ranks go on MPI_COMM_WORLD with this tag (the runtime works on its own duplicate, so
#: they never meet its messages).
CUE_TAG = 3701
CUE_BOUND_S = 30


def say(line: str) -> None:
    """One whole line in one write, so that the launcher never splices two ranks' lines together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def report(label: str, fn, *args, **kwargs):
    """Run ``fn``; print how it ended, with the time it took; exit 3 on a collective's error."""
    import collectives as col
    started = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except (col.CollectiveError, col.CollectiveUsageError) as e:
        say(f"rank {col.rank()}: {type(e).__name__} after {time.monotonic() - started:.2f} s in {label}: {e}")
        raise SystemExit(3)
    say(f"rank {col.rank()}: ok {label} after {time.monotonic() - started:.2f} s")
    return result


def _rank() -> int:
    import collectives as col
    return col.rank()


def cue(rank: int) -> None:
    """Tell ``rank`` that this one has come to the point it waits for."""
    from mpi4py import MPI
    MPI.COMM_WORLD.send(None, dest=rank, tag=CUE_TAG)   # (a few bytes: sent at once, whatever the receiver does)


def await_cue(source: int) -> None:
    """Wait for ``source``'s cue, polling (a blocking receive could not be bounded)."""
    await_cues([source])


def await_cues(sources) -> None:
    """Wait for a cue from each of ``sources``, as await_cue."""
    from mpi4py import MPI
    waiting = {source: MPI.COMM_WORLD.irecv(source=source, tag=CUE_TAG) for source in sources}
    give_up = time.monotonic() + CUE_BOUND_S
    while waiting:
        waiting = {source: r for source, r in waiting.items() if not r.test()[0]}
        if waiting and time.monotonic() > give_up:
            say(f"rank {_rank()}: no cue from rank(s) {sorted(waiting)} within {CUE_BOUND_S} s")
            raise SystemExit(4)
        time.sleep(0.01)


def await_ended(pids) -> None:
    """Wait until the processes ``pids`` (on this host) have ended."""
    from ring.transport.host_waits import process_state
    give_up = time.monotonic() + CUE_BOUND_S
    while any(process_state(pid) is None for pid in pids):
        if time.monotonic() > give_up:
            say(f"rank {_rank()}: processes {list(pids)} still ran after {CUE_BOUND_S} s")
            raise SystemExit(4)
        time.sleep(0.01)


def await_file(path: str, who: str, what: str) -> None:
    """Wait until the file ``path`` exists (another process made it once it came to ``what``).
    ``who`` names this process in the line said if it never comes."""
    give_up = time.monotonic() + CUE_BOUND_S
    while not os.path.exists(path):
        if time.monotonic() > give_up:
            say(f"{who}: {what} did not happen within {CUE_BOUND_S} s")
            raise SystemExit(4)
        time.sleep(0.01)


def when_inside(function, then) -> None:
    """Call ``then()``, from a thread of its own, once the main thread is inside ``function`` (its
    code on the main thread's stack; a tuple: any of them): what must happen during a call waits
    for the call, where a timer started before it could fire before the call began on a busy
    machine."""
    functions = function if isinstance(function, tuple) else (function,)
    codes = {inspect.unwrap(f).__code__ for f in functions}
    main, rank = threading.main_thread().ident, _rank()

    def watch():
        give_up = time.monotonic() + CUE_BOUND_S
        while time.monotonic() < give_up:
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code not in codes:
                frame = frame.f_back
            if frame is not None:
                then()
                return
            time.sleep(0.005)
        say(f"rank {rank}: the main thread was not inside {' or '.join(c.co_name for c in codes)} within "
            f"{CUE_BOUND_S} s")
        os._exit(4)

    threading.Thread(target=watch, name="cue watcher", daemon=True).start()
