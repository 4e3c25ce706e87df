"""The process's one world: MPI started lazily, a private communicator, the settings, the exit path.

The world is the group of every rank (``collectives.group.Group``); what the process's
groups share (these settings, the progress engine, whether the runtime has stopped) is its
:class:`Runtime`.

Settings (keyword arguments of :func:`init`, or environment variables). Those that
change what moves between ranks (all but the timeout) are compared across ranks
when the runtime is set up: if they differ, or a rank cannot read its own, every
rank raises the same CollectiveUsageError naming the setting and each rank's value.

``COLLECTIVES_SEGMENT_BYTES`` / ``segment_bytes``
    Largest message the ring sends, at most 1 GiB; "4M", "64K" and plain byte counts are
    accepted. Default: 4 MiB among ranks of one host, 1 MiB where a call's ranks span
    hosts (over TCP, 4 MiB messages lost the two-level all-reduce its gain at 64 MiB:
    the README's "Running on several hosts"); a value given applies to both, 0 restores
    the defaults. Bounds the receive scratch to two segments (and to the data) and sets
    how finely reduction overlaps transfer.
``COLLECTIVES_SMALL_BYTES`` / ``small_bytes``
    The largest call that may take recursive doubling (the latency path, whose messages
    carry the whole buffer and the cross-rank check); below it the cost model chooses
    (``ring.cost``). Default and most 256 KiB; 0 turns the latency path off.
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
``COLLECTIVES_ALGORITHM`` / ``algorithm``
    "auto" (default): each call takes the algorithm the cost model (``ring.cost``) predicts
    fastest for its size and group, and an all-reduce that does not take recursive doubling
    takes two levels (``ring.algorithms.allreduce_two_level``) where the group's ranks span
    more than one host with the same number, more than one, on each. "ring", "halving"
    (Rabenseifner's) or "doubling" (up to ``small_bytes``, above it the ring) force that
    algorithm on every collective that has it, never two levels; "hierarchical" insists on two
    levels (refused at setup where the world's layout does not allow it). Fixed at setup.
``COLLECTIVES_HOSTS`` / ``hosts``
    Treat the ranks as this many hosts, consecutive blocks of ranks (0, default: the real
    hosts), to run the two-level all-reduce on one machine. Like the algorithm, fixed at setup.

Leaving: when a process ends (its program returns, calls ``sys.exit``, raises, is
interrupted by Ctrl-C, or calls ``MPI.Finalize()``), it tells every other rank how
many collectives it completed (on each of its groups) and why it left, so that a rank waiting
for it in a later call raises CollectiveError within a second instead of waiting for the timeout.
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
from collectives.group import Group, hosts_of, two_level_layout
from collectives.sizes import parse_size
from ring import cost
from ring.doubling import MAX_PAYLOAD_BYTES
from ring.transport import device as device_transports
from ring.transport.base import TransportError

DEFAULT_SEGMENT_BYTES = 4 << 20
NETWORK_SEGMENT_BYTES = 1 << 20   # the default where a call's ranks span hosts
MAX_SEGMENT_BYTES = 1 << 30   # MPI counts messages in ints: keep every message well below 2 GiB
DEFAULT_SMALL_BYTES = MAX_PAYLOAD_BYTES
DEFAULT_TIMEOUT = 600.0


class Runtime:
    """What one process's groups share: the settings, the progress engine that runs their calls
    one at a time, and whether the runtime has stopped here (``failure``)."""

    def __init__(self, segment_bytes: int, small_bytes: int, check: bool, timeout: float,
                 gpu_transport: str = "auto", threads_checked: bool = False, threaded: bool = False,
                 timeline: str = "", algorithm: str = "auto", hosts: int = 0):
        self.gpu_transport = gpu_transport
        self.segment_bytes = segment_bytes
        self.small_bytes = small_bytes
        self.check = check
        self.timeout = timeout
        self.algorithm = algorithm         # one of ALGORITHMS: "auto" lets the cost model choose
        self.hosts = hosts                 # declared hosts (0: the real ones), see hosts_of
        self.timeline = timeline           # where the trace goes ("": none); see collectives.timeline
        self.groups: list[Group] = []      # the groups this rank belongs to, the world first
        self.world: Group | None = None
        self.failure: str | None = None    # set once a failure left this rank out of step
        self.failed_by_peer = False        # the failure came from another rank (timeout, a peer gone)
        self.root_cause: str | None = None   # a rank died: how every rank should hear it (see PeerLost)
        self.dead_rank: int | None = None    # ... and which (world rank)
        self.engine = progress.Engine(self, threaded)   # runs the calls one at a time, in issue order
        self.current = None                # the call running (collectives.call.Call), for the timeline
        self.threads_checked = threads_checked   # MPI is not thread-safe here: only its main thread may call
        self.closed = False                # the process has left (see collectives.world._leave)
        self._choices: dict = {}           # (collective, ranks, bytes, on the host, setting) -> algorithm

    def algorithm_for(self, op: str, n: int, nbytes: int, host: bool = True) -> str:
        """The algorithm of ``ring.cost.ALGORITHMS[op]`` that runs ``op`` on ``n`` ranks and ``nbytes``:
        the forced one (COLLECTIVES_ALGORITHM) where ``op`` has it, else the cost model's choice.
        Recursive doubling is for host arrays up to ``small_bytes``; GPU arrays take the ring.
        The same on every rank for the same call (remembered: choosing costs more than a small call)."""
        key = (op, n, nbytes, host, self.algorithm)
        found = self._choices.get(key)
        if found is None:
            if len(self._choices) >= 4096:
                self.forget_choices()
            if not host:
                found = "ring"
            elif self.algorithm in cost.candidates(op, nbytes, self.small_bytes):
                found = self.algorithm
            elif self.algorithm in cost.ALGORITHMS["allreduce"]:   # forced, but not for this call
                found = "ring"
            else:
                found = cost.choose(op, n, nbytes, segment_bytes=self.segment_bytes or DEFAULT_SEGMENT_BYTES,
                                    check=self.check, doubling_bytes=self.small_bytes)
            self._choices[key] = found
        return found

    def forget_choices(self) -> None:
        """After a change of settings: choose again (on every rank alike, as they change together)."""
        self._choices.clear()

    def note_failure(self, failure: str, error: BaseException, by_peer: bool) -> None:
        """This rank is out of step because of ``failure``; ``by_peer``: another rank caused it.
        Where ``error`` says a rank died, keep the root cause and that rank to pass on at exit."""
        self.failure = failure
        self.failed_by_peer = by_peer
        self.root_cause = getattr(error, "root", None)
        self.dead_rank = getattr(error, "dead", None)

    def segment_elems(self, dtype: np.dtype, transport=None) -> int:
        """The ring's segment in elements of ``dtype`` on ``transport``: the setting, else (0, the
        default) 4 MiB, or 1 MiB on a transport whose ranks span hosts."""
        nbytes = self.segment_bytes or (NETWORK_SEGMENT_BYTES if getattr(transport, "spans_hosts", False)
                                        else DEFAULT_SEGMENT_BYTES)
        return max(1, nbytes // dtype.itemsize)

    def transports(self) -> list:
        """Every transport of every group, for what concerns them all (stopping, polling gently)."""
        return [t for g in self.groups for t in g.transports()]

    def make_group(self, transport, ranks: tuple[int, ...], world: bool = False) -> Group:
        """A group over ``transport`` with the two levels of the hierarchical all-reduce when it
        takes that path (every member must call this together: it makes communicators)."""
        levels = None
        hosts = hosts_of(ranks, transport.hosts, self.hosts, len(ranks) if world else self.world.size())
        if self.algorithm in ("auto", "hierarchical") and not two_level_layout(hosts):
            here = hosts[transport.rank]
            on_host = [r for r in range(len(hosts)) if hosts[r] == here]
            host_order = list(dict.fromkeys(hosts))
            local = transport.split(host_order.index(here), transport.rank, watched=True)
            across = transport.split(on_host.index(transport.rank), host_order.index(here), watched=True)
            levels = (local, across)
        return Group(self, transport, ranks, world, levels)


_world: Group | None = None   # the world group, once set up

#: The settings that change what moves between ranks: (keyword, environment variable).
WIRE_SETTINGS = (("segment_bytes", "COLLECTIVES_SEGMENT_BYTES"), ("small_bytes", "COLLECTIVES_SMALL_BYTES"),
                 ("check", "COLLECTIVES_CHECK"), ("gpu_transport", "COLLECTIVES_GPU_TRANSPORT"),
                 ("timeline", "COLLECTIVES_TIMELINE"), ("algorithm", "COLLECTIVES_ALGORITHM"),
                 ("hosts", "COLLECTIVES_HOSTS"))
#: Settings fixed when the runtime is set up (they shape its communicators): init() cannot change them later.
SETUP_SETTINGS = ("algorithm", "hosts")
ALGORITHMS = ("auto", "ring", "halving", "doubling", "hierarchical")


def _byte_count(raw: str) -> int:
    return parse_size(raw.strip())


def _flag(raw: str) -> bool:
    return {"0": False, "1": True}[raw.strip()]


#: name: (environment variable, default, parse the environment's text, valid value?, what is expected)
_SETTINGS = {
    "segment_bytes": ("COLLECTIVES_SEGMENT_BYTES", 0, _byte_count,   # (0: the defaults of segment_elems)
                      lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEGMENT_BYTES,
                      f"a byte count from 0 (the defaults) to {MAX_SEGMENT_BYTES} (1G), like 4194304 or 4M"),
    "small_bytes": ("COLLECTIVES_SMALL_BYTES", DEFAULT_SMALL_BYTES, _byte_count,
                    lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_PAYLOAD_BYTES,
                    f"a byte count from 0 to {MAX_PAYLOAD_BYTES} (256K)"),
    "check": ("COLLECTIVES_CHECK", True, _flag, lambda v: isinstance(v, bool), "True/False (environment: 1 or 0)"),
    "timeout": ("COLLECTIVES_TIMEOUT", DEFAULT_TIMEOUT, float,
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
                "a positive number of seconds"),
    "gpu_transport": ("COLLECTIVES_GPU_TRANSPORT", "auto", str, lambda v: v in device_transports.CHOICES,
                      " or ".join(map(repr, device_transports.CHOICES))),
    "timeline": ("COLLECTIVES_TIMELINE", "", str, lambda v: isinstance(v, str), "a file name (or '' for none)"),
    "algorithm": ("COLLECTIVES_ALGORITHM", "auto", lambda raw: raw.strip(), lambda v: v in ALGORITHMS,
                  " or ".join(map(repr, ALGORITHMS))),
    "hosts": ("COLLECTIVES_HOSTS", 0, int, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "a number of hosts to treat consecutive blocks of ranks as (0: the real hosts)"),
}


def _read_settings(given: dict, from_environment: bool, rank: int = 0) -> tuple[dict, str]:
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
        problem = problem or timelines.check_path(settings["timeline"], rank)
    return settings, problem


def _check_records(records: list[bytes]) -> None:
    """Raise the same CollectiveUsageError on every rank if any rank found a problem with its
    settings, or if the settings that change what moves between ranks differ."""
    decoded = [json.loads(r or b"{}") for r in records]
    for r, record in enumerate(decoded):
        if record.get("left") == _ENDED:
            raise CollectiveError(f"init: rank {r} ended its program before its first collective")
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
         timeout: float | None = None, gpu_transport: str | None = None, timeline: str | None = None,
         algorithm: str | None = None, hosts: int | None = None, comm=None) -> None:
    """Start MPI (if needed) and this runtime; idempotent, and done lazily by the first collective.

    Every rank sets up together (the first ``init`` or collective is a collective call),
    bounded by the timeout. Arguments override the environment variables of the module
    docstring. ``comm``: an mpi4py intracommunicator whose ranks are the world (default:
    MPI.COMM_WORLD); the runtime works on its own duplicate of it. On a later call, the ones
    given replace the current settings: ``timeout`` on this rank alone; the others are compared
    across ranks again, so every rank must make that call (``algorithm``, ``hosts`` and
    ``comm`` are fixed once set up).

    >>> import collectives as col
    >>> col.init(); col.init(timeout=60)          # the second call only sets the timeout
    >>> 0 <= col.rank() < col.size()
    True
    >>> col.init(comm=MPI.COMM_WORLD.Split(MPI.COMM_WORLD.Get_rank() % 2))   # halves  # doctest: +SKIP
    """
    given = dict(segment_bytes=segment_bytes, small_bytes=small_bytes, check=check, timeout=timeout,
                 gpu_transport=gpu_transport, timeline=timeline, algorithm=algorithm, hosts=hosts)
    if _world is None:
        _start(given, comm=_communicator(comm))
        return
    runtime = _world.runtime
    fixed = [name for name in SETUP_SETTINGS if given[name] not in (None, getattr(runtime, name))]
    if comm is not None and not _same_ranks(_communicator(comm), _world.transport.comm):
        fixed.append("comm")
    if fixed:
        raise CollectiveUsageError(f"init: {', '.join(fixed)}: fixed when the runtime was set up (by the first "
                                   "init or collective); give it to the first init")
    settings, problem = _read_settings(given, from_environment=False, rank=_world.rank())
    if not any(given[name] is not None for name, _ in WIRE_SETTINGS):
        if problem:
            raise CollectiveUsageError(problem)   # only the timeout: this rank's own business
    else:
        current = {name: getattr(runtime, name) for name, _ in WIRE_SETTINGS}
        _world.transport.deadline = time.monotonic() + settings.get("timeout", runtime.timeout)
        try:
            _check_records(_world.transport.allgather_bytes(_record({**current, **settings}, problem)))
        except TransportError as e:
            runtime.failure = f"init on rank {_world.rank()}: {e}"
            raise CollectiveError(f"init: the ranks did not all change their settings together: {e}") from e
    for name, value in settings.items():
        setattr(runtime, name, value)
    runtime.forget_choices()   # (made with the old segment size, check and small_bytes)
    if "timeline" in settings:
        timelines.start(runtime.timeline, _world.rank())


def _same_ranks(comm, ours) -> bool:
    """Whether ``comm`` has the runtime's ranks in the runtime's order (``ours`` is its duplicate)."""
    MPI = _mpi()
    return MPI.Comm.Compare(comm, ours) in (MPI.IDENT, MPI.CONGRUENT)


def _communicator(comm):
    """``init(comm=...)``: an mpi4py intracommunicator (None: MPI.COMM_WORLD), else a usage error."""
    if comm is None:
        return None
    MPI = _mpi()
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        shown = "MPI.COMM_NULL" if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL else type(comm).__name__
        raise CollectiveUsageError(f"init: comm: expected an mpi4py intracommunicator (like MPI.COMM_WORLD "
                                   f"or one made by its Split), got {shown}")
    return comm


_setting_up = threading.Lock()   # two threads' first calls set up one world, not two


def _start(given: dict, setup_timeout: float | None = None, comm=None) -> None:
    """Set the world up once (``setup_timeout``: the first call's own ``timeout=`` bounds it)."""
    global _world
    with _setting_up:
        if _world is None:
            settings, problem = _read_settings(given, from_environment=True,
                                               rank=(comm or _mpi().COMM_WORLD).Get_rank())
            _world = _set_up(settings, problem, timeout=setup_timeout, comm=comm)


def _set_up(settings: dict, problem: str, left: str = "", timeout: float | None = None, comm=None) -> Group:
    """Every rank: start MPI if needed, make the private communicator, agree on the settings.
    ``left``: this process is ending before it ever set up; it takes part only to tell the
    others why (see :func:`_leave`)."""
    global _joined_setup_at_exit
    _joined_setup_at_exit = True   # (a rank that took part in a setup never joins another at exit)
    MPI = _mpi()
    from ring.transport import mpi as mpi_transport
    try:
        transport, records = mpi_transport.connect(timeout or settings.get("timeout", DEFAULT_TIMEOUT),
                                     _record(settings, problem, left), comm)
    except TransportError as e:
        raise CollectiveError(f"init: {e}") from e
    try:
        _check_records(records)
        _check_layout(settings, transport)
    except (CollectiveUsageError, CollectiveError):
        transport.close()
        raise
    mpi_transport.hear_failure_notices()
    threads_checked = MPI.Query_thread() < MPI.THREAD_SERIALIZED
    runtime = Runtime(threads_checked=threads_checked, threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE,
                      **settings)
    w = runtime.world = runtime.make_group(transport, tuple(range(transport.size)), world=True)
    timelines.start(runtime.timeline, w.rank())
    keyval = MPI.Comm.Create_keyval(delete_fn=lambda *_: _leave() or MPI.SUCCESS)
    MPI.COMM_SELF.Set_attr(keyval, True)   # MPI.Finalize() deletes COMM_SELF's attributes first thing
    return w


def _check_layout(settings: dict, transport) -> None:
    """The declared hosts fit the world, and a hierarchical all-reduce asked for can run on it (the
    same verdict on every rank: every rank knows every rank's host)."""
    declared, n = settings.get("hosts", 0), transport.size
    if declared > n:
        raise CollectiveUsageError(f"init: COLLECTIVES_HOSTS / hosts: {declared} hosts, but the world has only "
                                   f"{n} rank(s) (the runtime is not set up on any rank)")
    why_not = two_level_layout(hosts_of(tuple(range(n)), transport.hosts, declared, n))
    if settings.get("algorithm") == "hierarchical" and why_not:
        raise CollectiveUsageError(f"init: COLLECTIVES_ALGORITHM / algorithm: 'hierarchical' needs ranks on "
                                   f"several hosts, the same number (more than one) on each, but {why_not} "
                                   "(use 'auto' or 'ring'; COLLECTIVES_HOSTS declares hosts on one machine)")


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
_LEAVE_TOGETHER_SECONDS = 1.5   # how long a process that skips MPI_Finalize waits for the others' farewells


def _leave(finishing: bool = True) -> None:
    """Say farewell to every other rank and release the transports; once, at exit or at
    ``MPI.Finalize()``, whichever comes first. A process that ends before its first collective
    joins the setup the others may be waiting in, to tell them (see :func:`_leave_unset`).

    ``finishing``: MPI_Finalize follows, which waits for every rank, for ever if one died (MPICH
    under ``-disable-auto-cleanup``). So first every rank waits for the others at exit in a
    barrier it polls (``exit_barrier``); if a rank is known dead, or said it will not finalize,
    this process prints one line and ends at once with status 1, without MPI_Finalize and
    without the exit handlers registered before ``collectives`` was imported."""
    w = _world
    if w is None:
        _leave_unset()
        return
    runtime = w.runtime
    if runtime.closed:
        return
    runtime.engine.close(f"rank {w.rank()} is ending ({_why_leaving})" if _why_leaving else "")
    runtime.closed = True
    failed = runtime.failure is not None
    runtime.failure = runtime.failure or "this process has left the runtime (at exit or MPI.Finalize())"
    root = runtime.root_cause
    why = root or _why_leaving or (f"it stopped after a failure: {runtime.failure}" if failed else "")
    gone = w.transport.gone_at_exit()
    if gone:   # said before the farewell: the launcher may end this process once the others have left
        _say_no_finalize(w, gone)
    try:
        for g in runtime.groups:   # each group's members count their calls on it
            g.transport.farewell(g.completed, why, failed=runtime.failed_by_peer, root=root is not None,
                                 finalizing=not gone, dead=runtime.dead_rank)
        if runtime.timeline:   # (after the farewells: a rank still in a call hears why this one left)
            _write_timeline(w, healthy=not why)
        if finishing and not gone and _mpi_running():
            gone = w.transport.exit_barrier()
            if gone:
                _say_no_finalize(w, gone)
        if gone:
            _end_without_finalize(w)
    finally:
        for g in reversed(runtime.groups):   # (the world's communicator last: the others came from it)
            for transport in reversed(g.transports()):
                transport.close(failed)


def _say_no_finalize(w: Group, gone: list[int]) -> None:
    dead = [r for r in w.transport.known_dead() if r in gone]
    leaving = [r for r in gone if r not in dead]
    whom = " and ".join(([f"{', '.join(map(str, dead))} (gone)"] if dead else []) +
                        ([f"{', '.join(map(str, leaving))} (leaving without it too)"] if leaving else []))
    print(f"[rank {w.rank()}] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever "
          f"for rank(s) {whom}", file=sys.stderr, flush=True)


def _end_without_finalize(w: Group) -> None:
    """A rank died (or will not finalize): MPI_Finalize would wait for it for ever, so end now, once
    the other ranks have said farewell too (at most _LEAVE_TOGETHER_SECONDS): MPICH's launcher kills
    every process as soon as one ends after a death, which would cut the others' reports short."""
    w.transport.await_farewells(_LEAVE_TOGETHER_SECONDS)
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
    if not _mpi_running() or _joined_setup_at_exit or sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() < 2:
        return
    why = _why_leaving or _ENDED
    try:
        _set_up({}, "", left=why, timeout=_FAREWELL_SETUP_SECONDS)
    except (CollectiveError, CollectiveUsageError):
        pass   # nobody was waiting in setup (or they were told)


_ENDED = "(ended)"   # what a rank that ended normally before its first collective says at setup
_joined_setup_at_exit = False   # this process took part in a setup (at most one: see _set_up)


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
    if _world is not None and not _world.runtime.closed:
        _leave(finishing=False)
    time.sleep(grace)
    _mpi().COMM_WORLD.Abort(code)
    os._exit(code)   # (MPICH's Abort has been seen to return when another process had already ended)


def _write_timeline(w: Group, healthy: bool) -> None:
    """At exit, after the farewells: rank 0 writes every rank's events, handed to it by each rank
    that left normally; a rank that cannot meet rank 0 (after a failure on either, or on its way
    out after an uncaught exception) writes its own (see ``collectives.timeline``). Bounded by
    the timeout; the ranks still in a call have heard each farewell first, so this is no call."""
    recorder = timelines.current
    if recorder is None:
        return
    transport, path = w.transport, w.runtime.timeline
    deadline = time.monotonic() + w.runtime.timeout
    mine = json.dumps(recorder.trace_events()).encode()
    try:
        if healthy and w.rank() == 0:
            found = transport.collect_at_exit(deadline)
            events = [e for data in [mine, *found[1:]] if data for e in json.loads(data)]
            timelines.write(path, events)
            missing = [r for r in range(1, w.size()) if found[r] is None]
            if missing:
                print(f"[rank 0] collectives: {path} lacks rank(s) {', '.join(map(str, missing))}, which left after "
                      "a failure or did not come (each wrote its own file)", file=sys.stderr, flush=True)
            return
        if healthy and transport.deliver_at_exit(mine, deadline):
            return
    except Exception as e:   # noqa: BLE001 (at exit: an MPI error, or the file; say so, write our own)
        print(f"[rank {w.rank()}] collectives: the timeline could not be gathered ({e}); writing this rank's own",
              file=sys.stderr, flush=True)
    try:
        timelines.write(timelines.own_file(path, w.rank()), recorder.trace_events())
    except OSError as e:
        print(f"[rank {w.rank()}] collectives: the timeline was not written: {e}", file=sys.stderr, flush=True)


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


def world(setup_timeout: object = None) -> Group:
    """The world group, set up first if need be, within ``setup_timeout`` seconds if it is one."""
    if _world is None:
        _start({}, setup_timeout if isinstance(setup_timeout, (int, float)) and not isinstance(setup_timeout, bool)
               and setup_timeout > 0 else None)
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
    return _world.rank() if _world is not None else _mpi().COMM_WORLD.Get_rank()


def size() -> int:
    """The number of ranks in the world. Local: never waits for other ranks."""
    return _world.size() if _world is not None else _mpi().COMM_WORLD.Get_size()
