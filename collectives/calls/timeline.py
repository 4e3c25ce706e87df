"""The timeline: what each rank did when, as a Chrome trace (open it in Perfetto or chrome://tracing).

Turned on by ``COLLECTIVES_TIMELINE=trace.json`` or ``init(timeline="trace.json")``, on
every rank alike. Each rank is one process in the trace, with three tracks:

======================  ==================================================================
``program``             the program's own spans (:func:`span`) and its waits for handles
``collectives``         each call (``allreduce #12``) and inside it its phases: ``check``
                        (the cross-rank check), ``reduce-scatter``, ``all-gather``,
                        ``broadcast``, ``small`` (recursive doubling, check included)
``queue``               how long each nonblocking call waited behind the ones before it
======================  ==================================================================

Every call carries its sequence number, bytes and ``name=`` in its arguments. When the
process ends, after its farewell, each rank hands its events to rank 0, which writes the
file (no collective call: a rank still in one hears the farewell). A rank that ends after a
failure, or finds rank 0 did, writes its own events alone to ``trace.rank<r>.json`` beside
it (``trace.rank0.json`` for rank 0 too): ``trace.json`` only ever holds the merged trace.
The path is checked on every rank at setup: it must be a regular file or not exist yet (a
device, FIFO or symbolic link is refused, never replaced), in a directory where a file can
be created. Times are in microseconds on each host's monotonic clock: ranks on one host line
up exactly; across hosts they are offset by however the hosts' clocks differ.

A program adds its own spans, which cost nothing while no timeline is recorded:

>>> import collectives as col
>>> with col.timeline.span("forward", layer=3):
...     pass
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from pathlib import Path
from time import perf_counter
from typing import Iterator

from ring import execute

PROGRAM, COLLECTIVES, QUEUE = "program", "collectives", "queue"
_TRACKS = (PROGRAM, COLLECTIVES, QUEUE)


class Recorder:
    """One rank's events, kept in memory until the process ends: (track, name, start, end, args)."""

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        self.events: list[tuple[str, str, float, float, dict | None]] = []
        self._lock = threading.Lock()   # the program's thread and the progress engine's both record

    def add(self, track: str, name: str, start: float, end: float, args: dict | None = None) -> None:
        with self._lock:
            self.events.append((track, name, start, end, args))

    def trace_events(self) -> list[dict]:
        """This rank's events in the Chrome trace format (complete events, "ph": "X"), with the
        names of its process and tracks."""
        pid = self.rank
        out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}},
               {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
        for tid, track in enumerate(_TRACKS):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
        with self._lock:
            events = list(self.events)
        for track, name, start, end, args in events:
            event = {"ph": "X", "name": name, "pid": pid, "tid": _TRACKS.index(track),
                     "ts": round(start * 1e6, 3), "dur": round(max(end - start, 0.0) * 1e6, 3)}
            if args:
                event["args"] = args
            out.append(event)
        return out


#: The recorder of this process, or None while no timeline is recorded.
current: Recorder | None = None


def start(path: str, rank: int) -> None:
    """Record from now on (``path``: where the trace goes; "" stops recording)."""
    global current
    current = Recorder(path, rank) if path else None
    execute.observe(_phase if path else None)


def _phase(name: str, started: float, ended: float, nbytes: int) -> None:
    if current is not None:
        current.add(COLLECTIVES, name, started, ended, {"bytes": nbytes} if nbytes else None)


@contextlib.contextmanager
def span(name: str, **args) -> Iterator[None]:
    """Record the time spent inside the ``with`` block as a span ``name`` on this rank's program
    track (``args``: shown with it, e.g. ``layer=3``); costs one clock reading while no timeline is recorded."""
    started = perf_counter()   # (also before the runtime is set up: the first call in the span may do it)
    try:
        yield
    finally:
        if current is not None:
            current.add(PROGRAM, name, started, perf_counter(), args or None)


def add(track: str, name: str, start: float, end: float, args: dict | None = None) -> None:
    """Record one span (perf_counter seconds) if a timeline is recorded."""
    if current is not None:
        current.add(track, name, start, end, args)


def write(path: str, events: list[dict]) -> None:
    """Write ``events`` as a Chrome trace, atomically (a temporary file renamed into place), unless
    ``path`` has become something other than a regular file meanwhile (then OSError)."""
    target = Path(path)
    problem = _not_replaceable(target)
    if problem:
        raise OSError(f"{path} {problem}; the trace was not written")
    temporary = _temporary(target)
    try:
        temporary.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def _not_replaceable(target: Path) -> str:
    """Why the trace must not replace ``target`` ("" if it may: a regular file, or nothing yet).
    A symbolic link is refused even to a regular file: renaming over it would replace the link."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_ISDIR(mode):
        return "is a directory; give a file name"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a device, FIFO or socket)"
    return ""


def own_file(path: str, rank: int) -> str:
    """Where a rank that cannot meet the others writes its events, beside ``path`` (which only
    ever holds the merged trace).

    >>> own_file("runs/trace.json", 0), own_file("trace.json", 3)
    ('runs/trace.rank0.json', 'trace.rank3.json')
    """
    target = Path(path)
    return str(target.with_name(f"{target.stem}.rank{rank}{target.suffix}"))


def check_path(path: str, rank: int) -> str:
    """A problem with writing the trace to ``path`` or this rank's own file beside it ("" if
    none), found before anything runs: each must be a regular file or not exist yet, and a
    temporary file must be creatable in its directory (it is made and removed here).

    >>> check_path("/proc/t.json", 0)
    'init: COLLECTIVES_TIMELINE / timeline: cannot create a file in /proc (FileNotFoundError)'
    """
    setting = "init: COLLECTIVES_TIMELINE / timeline:"
    for target in (Path(path), Path(own_file(path, rank))):
        problem = _not_replaceable(target)
        if problem:
            return f"{setting} {target} {problem} (the trace is written only to a regular file)"
    parent = Path(path).parent
    if not parent.is_dir():
        return f"{setting} the directory {parent} does not exist"
    probe = _temporary(Path(path))
    try:
        with open(probe, "x"):
            pass
        probe.unlink()
    except OSError as e:
        return f"{setting} cannot create a file in {parent} ({type(e).__name__})"
    return ""
