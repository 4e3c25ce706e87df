"""The process's one world: MPI started lazily, a private communicator, the settings, the exit path.

Settings (keyword arguments of :func:`init`, or environment variables). Those that
change what moves between ranks (all but the timeout) are compared across ranks
when the runtime is set up: if they differ, or a rank cannot read its own, every
rank raises the same CollectiveUsageError naming the setting and each rank's value.

``COLLECTIVES_SEGMENT_BYTES`` / ``segment_bytes``
    Largest message the ring sends, default 4 MiB, at most 1 GiB; "4M", "64K" and
    plain byte counts are accepted. Bounds the receive scratch to two segments (and to
    the data) and sets how finely reduction overlaps transfer.
``COLLECTIVES_SMALL_BYTES`` / ``small_bytes``
    All-reduces (and reduce-scatters) of at most this many bytes take the latency path,
    recursive doubling, instead of the ring. Default 32 KiB, at most 64 KiB; 0 turns it off.
``COLLECTIVES_CHECK`` / ``check``
    1 (default): before data moves, every rank checks that all ranks make the same call
    (see ``collectives.call``). 0: skip that check on the ring path to save its round trip.
``COLLECTIVES_TIMEOUT`` / ``timeout``
    Seconds a collective (and the setup) may wait for the other ranks before raising
    CollectiveError, default 600. Each collective also takes ``timeout=`` for one call.
    The only setting that may differ between ranks.
``COLLECTIVES_GPU_TRANSPORT`` / ``gpu_transport``
    How cupy arrays move: "nccl", "staged" (through host memory, over MPI) or "auto"
    (default): NCCL where it can carry every rank, else staged (see
    ``ring.transport.device``). The transport is made by ``use_local_gpu()`` (GPU
    ``local_rank() % visible GPUs``), or else by the first collective on a cupy
    array, for the GPU that array is on: one GPU per rank.

Leaving: when a process ends (its program returns, calls ``sys.exit``, raises, is
interrupted by Ctrl-C, or calls ``MPI.Finalize()``), it tells every other rank how
many collectives it completed and why it left, so that a rank waiting for it in a
later call raises CollectiveError within a second instead of waiting for the timeout.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

import numpy as np

from collectives import progress, timeline as timelines
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.sizes import parse_size
from ring.doubling import MAX_PAYLOAD_BYTES
from ring.transport import device as device_transports
from ring.transport.base import Transport, TransportError

DEFAULT_SEGMENT_BYTES = 4 << 20
MAX_SEGMENT_BYTES = 1 << 30   # MPI counts messages in ints: keep every message well below 2 GiB
DEFAULT_SMALL_BYTES = 32 << 10
DEFAULT_TIMEOUT = 600.0


class World:
    """Rank, size, the ring's transport and the settings, shared by every collective."""

    def __init__(self, transport, segment_bytes: int, small_bytes: int, check: bool, timeout: float,
                 gpu_transport: str = "auto", threads_checked: bool = False, threaded: bool = False,
                 timeline: str = ""):
        self.transport = transport
        self.gpu_transport = gpu_transport
        self.device_transport = None   # made by the first collective on a cupy array (see transport_for)
        self.rank = transport.rank
        self.size = transport.size
        self.segment_bytes = segment_bytes
        self.small_bytes = small_bytes
        self.check = check
        self.timeout = timeout
        self.seq = 0                       # collectives called so far, the same on every rank in step
        self.completed = 0                 # collectives that returned (or raised in step on every rank)
        self.failure: str | None = None    # set once a failure left the ranks out of step
        self.engine = progress.Engine(self, threaded)   # runs the calls one at a time, in issue order
        self.current = None                # the call running (collectives.call.Call), for the timeline
        self.timeline = timeline           # where the trace goes ("": none); see collectives.timeline
        self.threads_checked = threads_checked   # MPI is not thread-safe here: only its main thread may call
        self.closed = False                # the process has left (see collectives.world._leave)
        self.failed_by_peer = False        # the failure came from another rank (timeout, a peer gone)

    def segment_elems(self, dtype: np.dtype) -> int:
        return max(1, self.segment_bytes // dtype.itemsize)

    def transport_for(self, x) -> Transport:
        """The transport that carries ``x``: MPI for numpy arrays; for cupy arrays the device
        transport, made on first use (every rank must be in this call: collectives agree first)."""
        if isinstance(x, np.ndarray):
            return self.transport
        self.open_device_transport(x.device.id)
        return self.device_transport

    def open_device_transport(self, device: int | None) -> int:
        """Make the transport for cupy arrays on GPU ``device`` (None: GPU ``local_rank %
        visible GPUs``), made current, unless it exists (then ``device`` must be its GPU); return
        the GPU's index. Every rank must make it together, as the first collective on a cupy
        array does (see ``ring.transport.device``)."""
        if self.device_transport is None:
            try:
                self.device_transport = device_transports.open_transport(self.transport, device,
                                                                         self.gpu_transport)
            except device_transports.Unavailable as e:   # the same on every rank: still in step
                setting = " (COLLECTIVES_GPU_TRANSPORT=nccl)" if self.gpu_transport == "nccl" else ""
                raise CollectiveError(f"{e}{setting}") from e
        elif device is not None and device != self.device_transport.gpu:
            raise CollectiveError(f"rank {self.rank}: an array on GPU {device}, but this rank's "
                                  f"collectives run on GPU {self.device_transport.gpu} (one GPU per rank)")
        return self.device_transport.gpu


_world: World | None = None

#: The settings that change what moves between ranks: (keyword, environment variable).
WIRE_SETTINGS = (("segment_bytes", "COLLECTIVES_SEGMENT_BYTES"), ("small_bytes", "COLLECTIVES_SMALL_BYTES"),
                 ("check", "COLLECTIVES_CHECK"), ("gpu_transport", "COLLECTIVES_GPU_TRANSPORT"),
                 ("timeline", "COLLECTIVES_TIMELINE"))


def _byte_count(raw: str) -> int:
    return parse_size(raw.strip())


def _flag(raw: str) -> bool:
    return {"0": False, "1": True}[raw.strip()]


#: name: (environment variable, default, parse the environment's text, valid value?, what is expected)
_SETTINGS = {
    "segment_bytes": ("COLLECTIVES_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES, _byte_count,
                      lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SEGMENT_BYTES,
                      f"a byte count from 1 to {MAX_SEGMENT_BYTES} (1G), like 4194304 or 4M"),
    "small_bytes": ("COLLECTIVES_SMALL_BYTES", DEFAULT_SMALL_BYTES, _byte_count,
                    lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_PAYLOAD_BYTES,
                    f"a byte count from 0 to {MAX_PAYLOAD_BYTES} (64K)"),
    "check": ("COLLECTIVES_CHECK", True, _flag, lambda v: isinstance(v, bool), "True/False (environment: 1 or 0)"),
    "timeout": ("COLLECTIVES_TIMEOUT", DEFAULT_TIMEOUT, float,
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"),
                "a positive number of seconds"),
    "gpu_transport": ("COLLECTIVES_GPU_TRANSPORT", "auto", str, lambda v: v in device_transports.CHOICES,
                      " or ".join(map(repr, device_transports.CHOICES))),
    "timeline": ("COLLECTIVES_TIMELINE", "", str, lambda v: isinstance(v, str), "a file name (or '' for none)"),
}


def _read_settings(given: dict, from_environment: bool) -> tuple[dict, str]:
    """The settings ``given`` as keyword arguments (None: not given), else (``from_environment``)
    from the environment, else the defaults; and the first problem found ("" if none), so that
    a rank with a bad setting can still tell the others instead of leaving them waiting."""
    settings, problem = {}, ""
    for name, (env, default, parse, ok, expected) in _SETTINGS.items():
        value = given.get(name)
        if value is not None:
            if not ok(value):
                problem = problem or f"init: {name}: expected {expected}, got {value!r}"
                continue
        elif from_environment and os.environ.get(env) is not None:
            raw = os.environ[env]
            try:
                value = parse(raw)
            except (ValueError, KeyError):
                value = None
            if value is None or not ok(value):
                problem = problem or f"init: {env}: expected {expected}, got {raw!r}"
                continue
        elif from_environment:
            value = default
        else:
            continue
        settings[name] = value
    if settings.get("timeline"):
        problem = problem or timelines.check_path(settings["timeline"])
    return settings, problem


def _check_records(records: list[bytes]) -> None:
    """Raise the same CollectiveUsageError on every rank if any rank found a problem with its
    settings, or if the settings that change what moves between ranks differ."""
    decoded = [json.loads(r or b"{}") for r in records]
    for r, record in enumerate(decoded):
        if record.get("left"):
            raise CollectiveError(f"init: rank {r} left before its first collective: {record['left']}")
    for r, record in enumerate(decoded):
        if record.get("problem"):
            raise CollectiveUsageError(f"{record['problem']} (on rank {r}; the runtime is not set up on any rank)")
    clauses = []
    for name, env in WIRE_SETTINGS:
        values = [record["settings"].get(name) for record in decoded]
        if any(v != values[0] for v in values):
            shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values) if r == 0 or v != values[0])
            clauses.append(f"{env} / {name} differs across ranks: {shown}")
    if clauses:
        raise CollectiveUsageError("init: " + "; ".join(clauses) + " (must be the same on every rank)")


def _record(settings: dict, problem: str, left: str = "") -> bytes:
    wire = {name: settings.get(name) for name, _ in WIRE_SETTINGS}
    return json.dumps({"settings": wire, "problem": problem[:400], "left": left[:400]}).encode()


def init(segment_bytes: int | None = None, *, small_bytes: int | None = None, check: bool | None = None,
         timeout: float | None = None, gpu_transport: str | None = None) -> None:
    """Start MPI (if needed) and this runtime; idempotent, and done lazily by the first collective.

    Every rank sets up together (the first ``init`` or collective is a collective call),
    bounded by the timeout. Arguments override the environment variables of the module
    docstring. On a later call, the ones given replace the current settings: ``timeout``
    on this rank alone; the others are compared across ranks again, so every rank must
    make that call.

    >>> import collectives as col
    >>> col.init(); col.init(timeout=60)          # the second call only sets the timeout
    >>> 0 <= col.rank() < col.size()
    True
    """
    global _world
    given = dict(segment_bytes=segment_bytes, small_bytes=small_bytes, check=check, timeout=timeout,
                 gpu_transport=gpu_transport)
    if _world is None:
        _start(given)
        return
    settings, problem = _read_settings(given, from_environment=False)
    if not any(given[name] is not None for name, _ in WIRE_SETTINGS):
        if problem:
            raise CollectiveUsageError(problem)   # only the timeout: this rank's own business
    else:
        w = _world
        current = {name: getattr(w, name) for name, _ in WIRE_SETTINGS}
        w.transport.deadline = time.monotonic() + settings.get("timeout", w.timeout)
        try:
            _check_records(w.transport.allgather_bytes(_record({**current, **settings}, problem)))
        except TransportError as e:
            w.failure = f"init on rank {w.rank}: {e}"
            raise CollectiveError(f"init: the ranks did not all change their settings together: {e}") from e
    for name, value in settings.items():
        setattr(_world, name, value)
    if "timeline" in settings:
        timelines.start(_world.timeline, _world.rank)


_setting_up = threading.Lock()   # two threads' first calls set up one world, not two


def _start(given: dict, setup_timeout: float | None = None) -> None:
    """Set the world up once (``setup_timeout``: the first call's own ``timeout=`` bounds it)."""
    global _world
    with _setting_up:
        if _world is None:
            settings, problem = _read_settings(given, from_environment=True)
            _world = _set_up(settings, problem, timeout=setup_timeout)


def _set_up(settings: dict, problem: str, left: str = "", timeout: float | None = None) -> World:
    """Every rank: start MPI if needed, make the private communicator, agree on the settings.
    ``left``: this process is ending before it ever set up; it takes part only to tell the
    others why (see :func:`_leave`)."""
    MPI = _mpi()
    from ring.transport.mpi import connect
    try:
        transport, records = connect(timeout or settings.get("timeout", DEFAULT_TIMEOUT),
                                     _record(settings, problem, left))
    except TransportError as e:
        raise CollectiveError(f"init: {e}") from e
    try:
        _check_records(records)
    except (CollectiveUsageError, CollectiveError):
        transport.close()
        raise
    threads_checked = MPI.Query_thread() < MPI.THREAD_SERIALIZED
    w = World(transport, threads_checked=threads_checked, threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE,
              **settings)
    timelines.start(w.timeline, w.rank)
    keyval = MPI.Comm.Create_keyval(delete_fn=lambda *_: _leave() or MPI.SUCCESS)
    MPI.COMM_SELF.Set_attr(keyval, True)   # MPI.Finalize() deletes COMM_SELF's attributes first thing
    return w


def _mpi():
    """mpi4py's MPI module, with MPI started (if the program has not, as with
    ``mpi4py.rc.initialize = False``; then this runtime also finalizes it at exit)."""
    from mpi4py import MPI   # starts MPI on first import, unless the program told mpi4py not to
    if MPI.Is_finalized():
        raise CollectiveError("MPI was already finalized in this process; the runtime cannot start")
    if not MPI.Is_initialized():
        global _started_mpi
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        _started_mpi = True
    return MPI


_started_mpi = False   # this runtime started MPI (the program had told mpi4py not to)


def _finalize_if_nobody_will() -> None:
    """At exit, after the farewell: finalize MPI if this runtime started it, or if the program told
    mpi4py not to (``mpi4py.rc.finalize = False``) and did not itself. A process that ends without
    MPI_Finalize makes MPICH's launcher kill the other ranks, which may still be finishing."""
    if _mpi_running() and (_started_mpi or sys.modules["mpi4py"].rc.finalize is False):
        sys.modules["mpi4py.MPI"].Finalize()


_why_leaving = ""   # set by the exception hook: why this process is ending


def _note_uncaught(kind, value, traceback) -> None:
    """sys.excepthook: remember why the process is ending (Ctrl-C is an uncaught KeyboardInterrupt)."""
    global _why_leaving
    _why_leaving = f"uncaught {kind.__name__}" + (f": {value}" if str(value) else "")
    _previous_excepthook(kind, value, traceback)


_previous_excepthook, sys.excepthook = sys.excepthook, _note_uncaught
_FAREWELL_SETUP_SECONDS = 2.0   # how long a process ending before setup waits to tell the others


def _leave() -> None:
    """Say farewell to every other rank and release the transports; once, at exit or at
    ``MPI.Finalize()``, whichever comes first. A process that ends on an uncaught exception
    before its first collective joins the setup the others may be waiting in, to tell them why."""
    global _why_leaving
    w = _world
    if w is None:
        if _why_leaving and _mpi_running():
            _why_leaving, why = "", _why_leaving   # once, even if MPI.Finalize() follows
            try:
                _set_up({}, "", left=why, timeout=_FAREWELL_SETUP_SECONDS)
            except (CollectiveError, CollectiveUsageError):
                pass   # nobody was waiting in setup (or they were told)
        return
    if w.closed:
        return
    w.engine.close(f"rank {w.rank} is ending ({_why_leaving})" if _why_leaving else "")
    if w.timeline:
        _write_timeline(w)
    w.closed = True
    failed = w.failure is not None
    w.failure = w.failure or "this process has left the runtime (at exit or MPI.Finalize())"
    try:
        why = _why_leaving or (f"it stopped after a failure: {w.failure}" if failed else "")
        w.transport.farewell(w.completed, why, failed=w.failed_by_peer)
    finally:
        if w.device_transport is not None:
            w.device_transport.close(failed)
        w.transport.close(failed)


def _write_timeline(w: World) -> None:
    """At exit: rank 0 writes every rank's events, gathered by one last collective; a rank that
    cannot meet the others (after a failure, or on its way out after an uncaught exception)
    writes its own (see ``collectives.timeline``)."""
    recorder = timelines.current
    if recorder is None:
        return
    if w.failure is None and not _why_leaving:
        from collectives.api import allgather
        mine = np.frombuffer(json.dumps(recorder.trace_events()).encode(), np.uint8)
        try:
            every = allgather(mine, name="timeline at exit")
            lengths = allgather(np.array([mine.size], np.int64), name="timeline lengths at exit")
        except (CollectiveError, CollectiveUsageError) as e:
            print(f"[rank {w.rank}] collectives: the timeline could not be gathered ({e}); "
                  "writing this rank's own", file=sys.stderr, flush=True)
        else:
            if w.rank == 0:
                ends = np.cumsum(lengths)
                events = [e for end, n in zip(ends, lengths) for e in json.loads(every[end - n:end].tobytes())]
                timelines.write(w.timeline, events)
            return
    timelines.write(timelines.own_file(w.timeline, w.rank), recorder.trace_events())


def _mpi_running() -> bool:
    """MPI is started and not finalized (never starting it: a program that did not is left alone)."""
    if "mpi4py.MPI" not in sys.modules:
        return False
    from mpi4py import MPI
    return MPI.Is_initialized() and not MPI.Is_finalized()


# At import, in this order (exit handlers run last registered first): the farewell, then MPI's
# end where nobody else will see to it. Python's exit handlers all run before mpi4py's own finalize.
atexit.register(_finalize_if_nobody_will)
atexit.register(_leave)


def world(setup_timeout: object = None) -> World:
    """The world, set up first if need be, within ``setup_timeout`` seconds if it is one."""
    if _world is None:
        _start({}, setup_timeout if isinstance(setup_timeout, (int, float)) and not isinstance(setup_timeout, bool)
               and 0 < setup_timeout < float("inf") else None)
    return _world


def local_rank() -> int:
    """This process's rank among the ranks on its host: pick its GPU with it.

    Sets the runtime up if it is not yet (a collective call: every rank must make it).

    >>> cupy.cuda.Device(col.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()  # doctest: +SKIP
    """
    return world().transport.local_rank


def local_size() -> int:
    """How many ranks run on this host (sets the runtime up if it is not yet, like local_rank)."""
    return world().transport.local_size


def rank() -> int:
    """This process's rank in the world, 0..size()-1. Local: never waits for other ranks."""
    return _world.rank if _world is not None else _mpi().COMM_WORLD.Get_rank()


def size() -> int:
    """The number of ranks in the world. Local: never waits for other ranks."""
    return _world.size if _world is not None else _mpi().COMM_WORLD.Get_size()
