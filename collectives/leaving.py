"""Leaving: what a process does when it ends, so that no rank waits for it in vain.

When a process ends (its program returns, calls ``sys.exit``, raises, is interrupted by
Ctrl-C, or calls ``MPI.Finalize()``), it tells every other rank how many collectives it
completed (on each of its groups) and why it left, so that a rank waiting for it in a later
call raises CollectiveError within a second instead of waiting for the timeout. Then every
rank waits for the others in a barrier it polls, so that MPI_Finalize never waits for a rank
that died; the timeline, if recorded, is written between the two (``collectives.timeline``).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time

from collectives import timeline as timelines, world as worlds
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.group import Group
from collectives.config import ENDED

_FAREWELL_SETUP_SECONDS = 2.0   # how long a process ending before setup waits to tell the others
_LEAVE_TOGETHER_SECONDS = 1.5   # how long a process that skips MPI_Finalize waits for the others' farewells
_why_leaving = ""   # set by the exception hook: why this process is ending


def _note_uncaught(kind, value, traceback) -> None:
    """sys.excepthook: remember why the process is ending (Ctrl-C is an uncaught KeyboardInterrupt)."""
    global _why_leaving
    _why_leaving = f"uncaught {kind.__name__}" + (f": {value}" if str(value) else "")
    _previous_excepthook(kind, value, traceback)


_previous_excepthook, sys.excepthook = sys.excepthook, _note_uncaught


def leave(finishing: bool = True) -> None:
    """Say farewell to every other rank and release the transports; once, at exit or at
    ``MPI.Finalize()``, whichever comes first. A process that ends before its first collective
    joins the setup the others may be waiting in, to tell them (see :func:`_leave_unset`).

    ``finishing``: MPI_Finalize follows, which waits for every rank, for ever if one died (MPICH
    under ``-disable-auto-cleanup``). So first every rank waits for the others at exit in a
    barrier it polls (``exit_barrier``); if a rank is known dead, or said it will not finalize,
    this process prints one line and ends at once with status 1, without MPI_Finalize and
    without the exit handlers registered before ``collectives`` was imported."""
    w = worlds.the_world
    if w is None:
        _leave_unset()
        return
    runtime = w.runtime
    if runtime.closed:
        return
    runtime.engine.close(f"rank {w.rank()} is ending ({_why_leaving})" if _why_leaving else "")
    runtime.closed = True
    failure = runtime.stopped_by   # (what failed before leaving, if anything)
    runtime.stop("this process has left the runtime (at exit or MPI.Finalize())")
    root = failure.root_cause if failure is not None else None
    why = root or _why_leaving or (f"it stopped after a failure: {failure.text}" if failure is not None else "")
    gone = w.transport.exits.gone_at_exit()
    if gone:   # said before the farewell: the launcher may end this process once the others have left
        _say_no_finalize(w, gone)
    try:
        for g in reversed(runtime.groups):   # each group's members count their calls on it; the world's
            # last: a rank that will not finalize ends once it has every world farewell, so none may follow
            g.transport.exits.farewell(g.completed, why, failed=failure is not None and failure.by_peer,
                                       root=root is not None, finalizing=not gone,
                                       dead=failure.dead_rank if failure is not None else None)
        if runtime.settings.timeline:   # (after the farewells: a rank still in a call hears why this one left)
            _write_timeline(w, healthy=not why)
        if finishing and not gone and worlds.mpi_running():
            gone = w.transport.exits.exit_barrier()
            if gone:
                _say_no_finalize(w, gone)
        if gone:
            _end_without_finalize(w)
    finally:
        for g in reversed(runtime.groups):   # (the world's communicator last: the others came from it)
            g.transports.close(failure is not None)
        from ring.transport import control   # (loaded by now; importing it at the top would start MPI)
        control.ignore_failure_notices()




def _say_no_finalize(w: Group, gone: list[int]) -> None:
    dead = [r for r in w.transport.control.known_dead() if r in gone]
    leaving = [r for r in gone if r not in dead]
    whom = " and ".join(([f"{', '.join(map(str, dead))} (gone)"] if dead else []) +
                        ([f"{', '.join(map(str, leaving))} (leaving without it too)"] if leaving else []))
    print(f"[rank {w.rank()}] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever "
          f"for rank(s) {whom}", file=sys.stderr, flush=True)


def _end_without_finalize(w: Group) -> None:
    """A rank died (or will not finalize): MPI_Finalize would wait for it for ever, so end now, once
    the other ranks have said farewell too (at most _LEAVE_TOGETHER_SECONDS): MPICH's launcher kills
    every process as soon as one ends after a death, which would cut the others' reports short."""
    w.transport.exits.await_farewells(_LEAVE_TOGETHER_SECONDS)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)


def _leave_unset() -> None:
    """At exit (or MPI.Finalize()) of a process that never set the runtime up, in a job of several
    ranks: join the setup for at most _FAREWELL_SETUP_SECONDS, saying why this process ends, so
    that ranks waiting in their first collective raise at once instead of at the timeout. Where
    no rank uses the runtime, every rank does this together: one setup exchange at exit (a few
    milliseconds), up to _FAREWELL_SETUP_SECONDS where the ranks end that far apart."""
    if not worlds.mpi_running() or worlds.joined_setup or sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() < 2:
        return
    why = _why_leaving or ENDED
    try:
        worlds.set_up({}, "", left=why, timeout=_FAREWELL_SETUP_SECONDS)
    except (CollectiveError, CollectiveUsageError):
        pass   # nobody was waiting in setup (or they were told)



def abort(code: int = 1, grace: float = 2.0) -> None:
    """End the whole job after a failure: tell every other rank that this one leaves and why (its
    farewell), give them ``grace`` seconds to report it, then abort every process of the job, so
    that a rank stuck outside the runtime (a stalled loop) cannot keep it alive for ever.

    >>> try:                                                   # doctest: +SKIP
    ...     train()
    ... except col.CollectiveError as e:
    ...     print(f"[rank {col.rank()}] error: {e}", file=sys.stderr, flush=True)
    ...     col.abort(1)
    """
    if worlds.the_world is not None and not worlds.the_world.runtime.closed:
        leave(finishing=False)
    time.sleep(grace)
    worlds.mpi().COMM_WORLD.Abort(code)
    os._exit(code)   # (MPICH's Abort has been seen to return when another process had already ended)


def _write_timeline(w: Group, healthy: bool) -> None:
    """At exit, after the farewells: rank 0 writes every rank's events, handed to it by each rank
    that left normally; a rank that cannot meet rank 0 (after a failure on either, or on its way
    out after an uncaught exception) writes its own (see ``collectives.timeline``). Bounded by
    the timeout; the ranks still in a call have heard each farewell first, so this is no call."""
    recorder = timelines.current
    if recorder is None:
        return
    exits, path = w.transport.exits, w.runtime.settings.timeline
    deadline = time.monotonic() + w.runtime.settings.timeout
    mine = json.dumps(recorder.trace_events()).encode()
    try:
        if healthy and w.rank() == 0:
            found = exits.collect_at_exit(deadline)
            events = [e for data in [mine, *found[1:]] if data for e in json.loads(data)]
            timelines.write(path, events)
            missing = [r for r in range(1, w.size()) if found[r] is None]
            if missing:
                print(f"[rank 0] collectives: {path} lacks rank(s) {', '.join(map(str, missing))}, which left after "
                      "a failure or did not come (each wrote its own file)", file=sys.stderr, flush=True)
            return
        if healthy and exits.deliver_at_exit(mine, deadline):
            return
    except Exception as e:   # noqa: BLE001 (at exit: an MPI error, or the file; say so, write our own)
        print(f"[rank {w.rank()}] collectives: the timeline could not be gathered ({e}); writing this rank's own",
              file=sys.stderr, flush=True)
    try:
        timelines.write(timelines.own_file(path, w.rank()), recorder.trace_events())
    except OSError as e:
        print(f"[rank {w.rank()}] collectives: the timeline was not written: {e}", file=sys.stderr, flush=True)



def _finalize_if_nobody_will() -> None:
    """At exit, after the farewell: finalize MPI if this runtime started it, or if the program told
    mpi4py not to (``mpi4py.rc.finalize = False``) and did not itself. A process that ends without
    MPI_Finalize makes MPICH's launcher kill the other ranks, which may still be finishing."""
    if worlds.mpi_running() and (worlds.started_mpi or sys.modules["mpi4py"].rc.finalize is False):
        sys.modules["mpi4py.MPI"].Finalize()


# At import, in this order (exit handlers run last registered first): the farewell, then MPI's
# end where nobody else will see to it. Python's exit handlers all run before mpi4py's own finalize.
atexit.register(_finalize_if_nobody_will)
atexit.register(leave)
worlds.at_finalize = leave
