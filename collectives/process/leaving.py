"""Leaving: what a process does when it ends, so that no rank waits for it in vain.

When a process that used the runtime ends (its program returns, calls ``sys.exit``, raises, is
interrupted by Ctrl-C, or calls ``MPI.Finalize()``), it tells every other rank how many collectives
it completed (on each of its groups) and why it left, so that a rank waiting for it in a later
call raises CollectiveError within a second instead of waiting for the timeout. Then every
rank waits for the others in a barrier it polls, so that MPI_Finalize never waits for a rank
that died; the timeline, if recorded, is written between the two (``collectives.calls.timeline``).
``collectives.process.startup`` calls :func:`leave` from the hooks that its first use installs
(``life.install_hooks``); how the process ends (its status, its last line) is ``ending``'s verdict.
"""
from __future__ import annotations

import gc
import io
import json
import os
import signal
import time
import warnings
from dataclasses import replace
from typing import NoReturn

from collectives.process import ending, supervision
from collectives.calls import timeline as timelines
from collectives.groups.group import Group
from collectives.process.life import life
from ring.transport.host_waits import siblings
from ring.transport.mpi import notices

_LEAVE_TOGETHER_SECONDS = 1.5   # how long a process that skips MPI_Finalize waits for the others' farewells


def leave(w: Group, finishing: bool = True) -> None:
    """Say farewell to every other rank and release the transports of the world ``w`` and its
    groups; once (a later call does nothing), at exit or at ``MPI.Finalize()``, whichever comes first.

    ``finishing``: MPI_Finalize follows, which waits for every rank, for ever if one died (MPICH under
    ``-disable-auto-cleanup``). So first every rank waits for the others at exit in a barrier it polls (``exit_barrier``);
    if a rank is known dead, or said it will not finalize, this process prints one line and ends at once with
    status 1, without MPI_Finalize and the exit handlers registered before the program first used ``collectives``.
    A Ctrl-C anywhere in this (the farewell's reads and words, the barrier) ends it with status 130, saying
    so, without MPI_Finalize (``_interrupted_at_exit``: one that escaped the farewell left MPI_Finalize
    waiting for the others, and the others for its farewell, for ever)."""
    runtime = w.runtime
    if runtime.closed:
        return
    uncaught = life.why_ending
    why, failed, root = uncaught, False, None
    ended_well = False   # (whether every rank did: the transports' teardown must be the same on all, see close)
    try:
        runtime.engine.close(f"rank {w.rank()} is ending ({uncaught})" if uncaught else "")
        failure = runtime.leave()   # (what failed before leaving, if anything)
        root = failure.root_cause if failure is not None else None
        failed = failure is not None and failure.by_peer   # (what each farewell says: another rank's failure caused it)
        why = root or uncaught or (f"it stopped after a failure: {failure.text}" if failure is not None else "")
        gone = w.transport.exits.gone_at_exit()
        # (the ranks still at work are named too, but where the elastic job's work is finished)
        absent = w.transport.exits.not_at_exit(gone) if gone and not life.work_finished else []
        what = ending.AtExit(w.rank(), why, life.work_finished, tuple(gone), tuple(w.lost()) if gone else (),
                             absent=tuple(absent), finishing=finishing, outlived=runtime.outlived)
        verdict = ending.at_exit(what)
        if gone:   # said before the farewell: the launcher may end this process once the others have left
            ending.print_line(verdict.line)
        for g in reversed(runtime.groups):   # each group's members count their calls on it; the world's
            # last: a rank that will not finalize ends once it has every world farewell, so none may follow
            g.transport.exits.farewell(g.completed, why, failed=failed,
                                       root=root is not None, finalizing=not gone,
                                       dead=failure.dead_rank if failure is not None else None,
                                       sent=g.transport.p2p.sent() if finishing and not (why or gone) else None)
        if runtime.settings.timeline:   # (after the farewells: a rank still in a call hears why this one left)
            _write_timeline(w, healthy=not why)
        if finishing and not gone and not runtime.outlived:
            patience = runtime.exit_patience(failure)
            gone, missing = _exit_barrier(w, patience, runtime.settings.timeout)
            late = () if gone else tuple(missing)
            absent = tuple(missing) if gone and not life.work_finished else ()   # (as above)
            verdict = ending.at_exit(replace(what, gone=tuple(gone), lost=tuple(w.lost()) if gone else (),
                                             late=late, absent=absent, patience=patience))
            ending.print_line(verdict.line)
            if late:   # (the farewell said this rank would finalize: a rank that comes later must not wait for it)
                w.transport.exits.farewell(w.completed, why, failed=failed,
                                           root=root is not None, finalizing=False)
        if verdict.status is not None:   # (without MPI_Finalize: after a death, or where MPI's world outlived one)
            _end_without_finalize(w, verdict.status)
        if finishing and life.work_finished and not why:   # (into MPI_Finalize, the elastic job done: a rank
            supervision.tell(supervision.Word.FINALIZING)     # that dies in there now would hold this one)
        ended_well = not why and w.transport.exits.all_left_well()
    except KeyboardInterrupt:
        _interrupted_at_exit(w, why, failed, root is not None)
    finally:
        for g in reversed(runtime.groups):   # (the world's communicator last: the others came from it)
            g.transports.close(failed=not ended_well)
        notices.ignore_failure_notices()


def _interrupted_at_exit(w: Group, why: str, failed: bool, root: bool) -> NoReturn:
    """Ctrl-C while this rank says farewell or waits for the others at exit: the person at the keyboard
    wants it to end, and MPI_Finalize would wait for them too. So it says so, tells the others it will not
    finalize (so none waits for it), and ends with status 130 without MPI_Finalize; a second Ctrl-C
    meanwhile changes nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    missing = w.transport.exits.not_at_exit([])
    waiting = (f" while waiting for rank(s) {', '.join(map(str, missing))}" if missing else " (every rank is at exit)")
    ending.print_line(f"[rank {w.rank()}] collectives: interrupted (Ctrl-C) at exit{waiting}: exiting with status 130 "
                      f"without MPI_Finalize{', which would wait for them' if missing else ''}")
    w.transport.exits.farewell(w.completed, why or "it was interrupted (Ctrl-C) at exit", failed=failed, root=root,
                               finalizing=False)
    _end_without_finalize(w, 130)


def _exit_barrier(w: Group, patience: float, timeout: float) -> tuple[list[int], list[int]]:
    """The exit barrier (``exit_barrier``) for at most ``patience`` seconds. For ever (a healthy run,
    whose ranks may end far apart) is not silent: past ``timeout`` it says once which ranks it
    still waits for, then goes on waiting."""
    exits, began = w.transport.exits, time.monotonic()
    if patience <= timeout:
        return exits.exit_barrier(began + patience)
    gone, missing = exits.exit_barrier(began + timeout)
    if gone or not missing:
        return gone, missing
    ending.print_line(f"[rank {w.rank()}] collectives: at exit, still waiting for rank(s) "
                      f"{', '.join(map(str, missing))} after {timeout:g} s (COLLECTIVES_TIMEOUT): MPI_Finalize waits "
                      "for every rank (still in its own code?)")
    return exits.exit_barrier(began + patience, again=True)


#: How long a process that ends after a failure gives the other ranks to report theirs before its end
#: lets MPICH's launcher kill them (``end_unset``; ``collectives.process.startup.abort``'s default).
REPORT_GRACE_SECONDS = 2.0


def end_unset(rank: int, missed: bool = False) -> None:
    """At exit of a process whose runtime was never set up, after the launcher's failure notice
    (a process of the job ended before the setup), or, ``missed``, after a setup that timed out (a
    rank did not come; the runtime cannot be set up again on this job): MPI_Finalize would wait for
    that process for ever, or MPICH's launcher after it, as long as that process runs (stuck in its
    own code: for ever). So end now, with status 1; after a missed setup REPORT_GRACE_SECONDS after
    this process's program ended, as ``abort`` does, so that the ranks that timed out with it report
    theirs before the launcher kills them for this process's end. The program's open files are
    flushed first (``os._exit`` skips Python's own end; the exit handlers registered before the
    runtime's first use do not run)."""
    verdict = ending.never_set_up(rank, missed)
    ending.print_line(verdict.line)
    _flush_open_files()
    if missed:
        time.sleep(REPORT_GRACE_SECONDS)
    os._exit(verdict.status)


#: How long a process that Ctrl-C ends waits, after MPI_Finalize, for the other ranks on its host to end.
OUTLAST_SECONDS = 2.0


def outlast_host_mates() -> None:
    """After MPI_Finalize, in a process that an uncaught Ctrl-C ends: Python ends it by SIGINT next,
    and a launcher's proxy that sees a rank die of a signal kills the others it started (MPICH's:
    SIGKILL, under ``-disable-auto-cleanup`` too); one still finishing then dies of it, and mpiexec
    reports the job's statuses or'ed (2 | 9 = 11, "Segmentation fault"). So it waits, at most
    OUTLAST_SECONDS, until the other processes its launcher started beside it have ended: past the
    exit barrier, they are only finishing."""
    deadline = time.monotonic() + OUTLAST_SECONDS
    while siblings() and time.monotonic() < deadline:
        time.sleep(0.01)


def _flush_open_files() -> None:
    """Write out what the program's open files still buffer, as Python's own end would. (Quietly: the
    type check of every object Python holds touches modules' deprecated names, which warn.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for thing in gc.get_objects():
            if isinstance(thing, io.IOBase) and not thing.closed:
                try:
                    thing.flush()
                except (OSError, ValueError):
                    pass


def _end_without_finalize(w: Group, status: int = 1) -> NoReturn:
    """A rank died (or will not finalize): MPI_Finalize would wait for it for ever, so end now, once
    the other ranks have said farewell too (at most _LEAVE_TOGETHER_SECONDS): MPICH's launcher kills
    every process as soon as one ends after a death, which would cut the others' reports short."""
    w.transport.exits.await_farewells(_LEAVE_TOGETHER_SECONDS)
    _flush_open_files()
    os._exit(status)


def _write_timeline(w: Group, healthy: bool) -> None:
    """At exit, after the farewells: rank 0 writes every rank's events, handed to it by each rank
    that left normally; a rank that cannot meet rank 0 (after a failure on either, or on its way
    out after an uncaught exception) writes its own (see ``collectives.calls.timeline``). Bounded by
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
                ending.print_line(f"[rank 0] collectives: {path} lacks rank(s) {', '.join(map(str, missing))}, which "
                                  "left after a failure or did not come (each wrote its own file)")
            return
        if healthy and exits.deliver_at_exit(mine, deadline):
            return
    except Exception as e:   # noqa: BLE001 (at exit: an MPI error, or the file; say so, write our own)
        ending.print_line(f"[rank {w.rank()}] collectives: the timeline could not be gathered ({e}); writing this "
                          "rank's own")
    try:
        timelines.write(timelines.own_file(path, w.rank()), recorder.trace_events())
    except OSError as e:
        ending.print_line(f"[rank {w.rank()}] collectives: the timeline was not written: {e}")
