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
process ends, rank 0 gathers every rank's events (one collective, after everything else)
and writes the file. A rank that ends after a failure writes its own events alone, to the
file on rank 0 and to ``trace.rank<r>.json`` on the others, since the ranks can no longer
meet. Times are in microseconds on each host's monotonic clock: ranks on one host line
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
    execute.observer = _phase if path else None


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
    """Write ``events`` as a Chrome trace, atomically (a temporary file renamed into place)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    os.replace(temporary, target)


def own_file(path: str, rank: int) -> str:
    """Where a rank that cannot meet the others writes its events: ``path`` on rank 0, else
    ``<stem>.rank<r><suffix>`` beside it."""
    if rank == 0:
        return path
    target = Path(path)
    return str(target.with_name(f"{target.stem}.rank{rank}{target.suffix}"))


def check_path(path: str) -> str:
    """A problem with writing the trace to ``path`` ("" if none), found before anything runs."""
    target = Path(path)
    if target.is_dir():
        return f"init: COLLECTIVES_TIMELINE / timeline: {path} is a directory; give a file name"
    parent = target.parent
    if not parent.is_dir():
        return f"init: COLLECTIVES_TIMELINE / timeline: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"init: COLLECTIVES_TIMELINE / timeline: the directory {parent} is not writable"
    return ""
