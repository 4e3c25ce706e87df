"""The process's one world: MPI started lazily, a private communicator, the agreed settings.

The world is the group of every rank (``collectives.groups.group.Group``); the first ``init`` or
collective sets it up, on every rank together, and tells the process's ``life`` (which owns it). The
program's first use of the runtime (anything that asks :func:`mpi` for MPI) installs the hooks that
see the process out (``life.install_hooks``): at exit, or inside the program's own ``MPI.Finalize()``,
the farewell (``leaving``); settings: ``config``.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, replace

from collectives.process import changes, launchers, leaving, rendezvous, supervision
from collectives.calls import config
from collectives.calls import timeline as timelines
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.groups.group import Group
from collectives.groups.making import make_group
from collectives.process.life import life
from collectives.calls.runtime import Runtime, hosts_of, two_level_layout
from ring.transport.mpi import notices
from ring.transport.base import Bound, MPIOnlyTransport, PeerLost, TransportError, TransportTimeout

#: ``life.world``'s copy for ``collectives.api``'s per-call path (10 ns a read; 380 ns by a module __getattr__)
the_world: Group | None = None


def init(segment_bytes: int | None = None, *, small_bytes: int | None = None, check: bool | None = None,
         timeout: float | None = None, gpu_transport: str | None = None, timeline: str | None = None,
         algorithm: str | None = None, hosts: int | None = None, comm=None) -> None:
    """Start MPI (if needed) and this runtime; idempotent, and done lazily by the first collective.

    Every rank sets up together (the first ``init`` or collective is a collective call),
    bounded by the timeout. Arguments override the environment variables of
    ``collectives.calls.config``. ``comm``: an mpi4py intracommunicator whose ranks are the world
    (default: MPI.COMM_WORLD); the runtime works on its own duplicate of it. On a later call,
    the ones given replace the current settings: ``timeout`` on this rank alone; the others are
    compared across ranks again, so every rank must make that call (``algorithm``, ``hosts``
    and ``comm`` are fixed once set up).

    >>> import collectives as col
    >>> col.init(); col.init(timeout=60)          # the second call only sets the timeout
    >>> 0 <= col.rank() < col.size()
    True
    >>> col.init(comm=MPI.COMM_WORLD.Split(MPI.COMM_WORLD.Get_rank() % 2))   # halves  # doctest: +SKIP
    """
    given = dict(segment_bytes=segment_bytes, small_bytes=small_bytes, check=check, timeout=timeout,
                 gpu_transport=gpu_transport, timeline=timeline, algorithm=algorithm, hosts=hosts)
    if life.world is None:
        _start(given, comm=_communicator(comm))
        return
    runtime = life.world.runtime
    fixed = [name for name in config.SETUP_SETTINGS if given[name] not in (None, getattr(runtime.settings, name))]
    if comm is not None and not _same_ranks(_communicator(comm), life.world.transport.comm):
        fixed.append("comm")
    if fixed:
        raise CollectiveUsageError(f"init: {', '.join(fixed)}: fixed when the runtime was set up (by the first "
                                   "init or collective); give it to the first init")
    changed, problem = config.read(given, from_environment=False, rank=life.world.rank())
    if not any(given[name] is not None for name, _ in config.WIRE_SETTINGS):
        if problem:
            raise CollectiveUsageError(problem)   # only the timeout: this rank's own business
    else:
        _agree_again({**asdict(runtime.settings), **changed}, problem, changed.get("timeout", runtime.settings.timeout))
    runtime.apply(replace(runtime.settings, **changed))
    if "timeline" in changed:
        timelines.start(runtime.settings.timeline, life.world.rank())


def _agree_again(proposed: dict, problem: str, timeout: float) -> None:
    """A later ``init`` that changes settings: every rank compares the ``proposed`` ones again."""
    runtime = life.world.runtime
    bound = Bound(life.world.seq, time.monotonic() + timeout, runtime.stopped)
    try:
        config.check_records(life.world.transport.allgather_bytes(config.record(proposed, problem), bound))
    except TransportError as e:
        runtime.stop(f"init on rank {life.world.rank()}: {e}")
        raise CollectiveError(f"init: the ranks did not all change their settings together: {e}") from e


def settings() -> config.Settings:
    """The settings in force on this rank, as agreed at setup (sets the runtime up first, like
    ``local_rank``); read-only: ``init(...)`` changes them, on every rank together.

    >>> col.settings().check, col.settings().algorithm                # doctest: +SKIP
    (True, 'auto')
    """
    return world().runtime.settings


def world(setup_timeout: object = None) -> Group:
    """The world group, set up first if need be, within ``setup_timeout`` seconds if it is one."""
    if life.world is None:
        _start({}, setup_timeout if isinstance(setup_timeout, (int, float)) and not isinstance(setup_timeout, bool)
               and setup_timeout > 0 else None)
    return life.world


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
    """This process's rank in the world, 0..size()-1. Local: never waits for other ranks (but a
    newcomer to a running job joins it first: its MPI world is itself alone)."""
    if life.world is None and changes.joining():
        world()
    return life.world.rank() if life.world is not None else mpi().COMM_WORLD.Get_rank()


def size() -> int:
    """The number of ranks in the world. Local: never waits (but a newcomer joins first, as for ``rank``)."""
    if life.world is None and changes.joining():
        world()
    return life.world.size() if life.world is not None else mpi().COMM_WORLD.Get_size()


def _same_ranks(comm, ours) -> bool:
    """Whether ``comm`` has the runtime's ranks in the runtime's order (``ours`` is its duplicate)."""
    return mpi().Comm.Compare(comm, ours) in (mpi().IDENT, mpi().CONGRUENT)


def _communicator(comm):
    """``init(comm=...)``: an mpi4py intracommunicator (None: MPI.COMM_WORLD), else a usage error."""
    if comm is None:
        return None
    MPI = mpi()
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        shown = "MPI.COMM_NULL" if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL else type(comm).__name__
        raise CollectiveUsageError(f"init: comm: expected an mpi4py intracommunicator (like MPI.COMM_WORLD "
                                   f"or one made by its Split), got {shown}")
    return comm


_setting_up = threading.Lock()   # two threads' first calls set up one world, not two


def _start(given: dict, setup_timeout: float | None = None, comm=None) -> None:
    """Set the world up once (``setup_timeout``: the first call's own ``timeout=`` bounds it); a newcomer
    spawned into a running job (``changes``) joins its world; a lone task of several srun started is refused."""
    with _setting_up:
        if life.world is None:
            if comm is None:   # (a newcomer too: its supervisor hears STARTED before joining closes the pipe)
                started = mpi()
                if not changes.joining():
                    launchers.refuse_lone_srun_task(started)
            joining = changes.join_spawners() if comm is None and changes.joining() else None
            comm = joining or comm
            found, problem = config.read(given, from_environment=True, rank=(comm or mpi().COMM_WORLD).Get_rank())
            _put_in_place(set_up(found, problem, timeout=setup_timeout, comm=comm, outlived=joining is not None))


def rebuild(newcomers: int = 0, hosts: list[str] | None = None, timeout: float | None = None) -> changes.Change:
    """Replace the world after a membership change, on every member of the new one together.

    After a death (the runtime stopped because a rank died or its host vanished), every survivor
    calls it: they agree on who is gone and make a world of themselves, numbered in their old
    order (rank 0 is the lowest survivor). With ``newcomers``, every member then spawns that many
    processes running this program (on ``hosts`` in turn, if given), which join as the last ranks.
    The old world, its groups and a ``wait()`` on a call in flight raise MembershipChanged from
    then on. Bounded by ``timeout`` (default: the runtime's). ``col.elastic.run`` calls it.

    >>> change = startup.rebuild()   # collectives.process.startup, on the survivors of rank 3 of 4  # doctest: +SKIP
    >>> change.gone, col.size(), change.text                                          # doctest: +SKIP
    ((3,), 3, 'rank 3 gone: 4 -> 3 ranks')
    """
    with _setting_up:
        old = world()
        settings = old.runtime.settings
        timeout = settings.timeout if timeout is None else timeout
        until = time.monotonic() + timeout
        gone, comm, given_up = (), old.transport.comm, ""
        old.runtime.engine.close()   # (its thread must not poll the old transports while the ranks agree)
        if old.runtime.failure is not None:   # (a change of a stopped world is a recovery)
            gone, comm = changes.survivors_communicator(old, until)
        if newcomers:   # (a spawn given up leaves the members that live in a world of their own)
            gone, comm, given_up = changes.grow(old, comm, newcomers, hosts or [], until)
        gone = tuple(old.ranks[r] for r in gone)
        new = set_up(asdict(settings), "", timeout=max(until - time.monotonic(), 1.0), comm=comm,
                     outlived=bool(gone or newcomers) or old.runtime.outlived)
        change = changes.Change(gone, new.size() - old.size() + len(gone), old.size(), new.size())
        change = replace(change, text=change.text + given_up)
        old.runtime.retire(change.text)
        for group in reversed(old.runtime.groups):
            group.transports.close(failed=True)
        _put_in_place(new)
        return change


def _put_in_place(world: Group) -> None:
    """The world set up, or rebuilt: ``life`` owns it (``the_world``: the per-call path's copy)."""
    global the_world
    life.set_world(world)
    the_world = world


def set_up(found: dict, problem: str, left: str = "", timeout: float | None = None, comm=None,
           outlived: bool = False) -> Group:
    """Every rank: start MPI if needed, make the private communicator, agree on the settings.
    ``left``: this process is ending before it ever set up; it takes part only to tell the
    others why (see :func:`_leave_unset`). ``outlived``: MPI's world has processes that are gone
    or were not there at the start (see ``Runtime.outlived``)."""
    MPI = mpi()
    from ring.transport.mpi import setup as mpi_setup   # (imported here: importing it starts MPI)
    notices.hear_failure_notices()   # (before the setup: a notice there would end this process unheard)
    heeded = 0 if comm is None else notices.failure_notices()   # (the first setup: every notice since MPI started)
    beside = launchers.started_under_proxy() if comm is None else 0   # (the world's ranks on this host, watched)
    # A rank that took part in a setup never joins another at exit; it takes part from its first message
    # on (a Ctrl-C in the lines above, which send nothing, once left the others waiting their whole timeout)
    life.took_part_in_setup()
    try:
        transport, records = mpi_setup.connect(timeout or found.get("timeout", config.DEFAULT_TIMEOUT),
                                                   config.record(found, problem, left), comm, heeded, beside)
    except TransportError as e:
        life.missed_setup(isinstance(e, TransportTimeout) and not left,   # (a farewell's setup that nobody joined ends well)
                          lost_a_process=isinstance(e, PeerLost))
        raise CollectiveError(f"init: {e}") from None   # (its words are all in the message: no chained traceback)
    try:
        config.check_records(records)
        _check_layout(found, transport)
    except (CollectiveUsageError, CollectiveError):
        transport.close()
        raise
    level = MPI.Query_thread()
    names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED"}
    runtime = Runtime(config.Settings(**found), threads_checked=names.get(level, "") if level < MPI.THREAD_SERIALIZED
                      else "", threaded=level == MPI.THREAD_MULTIPLE, outlived=outlived)
    w = runtime.world = make_group(Group, runtime, transport, tuple(range(transport.size)), world=True)
    timelines.start(runtime.settings.timeline, w.rank())
    if life.watch_finalize():
        keyval = MPI.Comm.Create_keyval(delete_fn=lambda *_: _leave() or MPI.SUCCESS)
        MPI.COMM_SELF.Set_attr(keyval, True)   # MPI.Finalize() deletes COMM_SELF's attributes first thing
    return w


def _check_layout(found: dict, transport: MPIOnlyTransport) -> None:
    """The declared hosts fit the world, and a hierarchical all-reduce asked for can run on it (the
    same verdict on every rank: every rank knows every rank's host)."""
    declared, n = found.get("hosts", 0), transport.size
    if declared > n:
        raise CollectiveUsageError(f"init: COLLECTIVES_HOSTS / hosts: {declared} hosts, but the world has only "
                                   f"{n} rank(s) (the runtime is not set up on any rank)")
    why_not = two_level_layout(hosts_of(tuple(range(n)), transport.hosts, declared, n))
    if found.get("algorithm") == "hierarchical" and why_not:
        raise CollectiveUsageError(f"init: COLLECTIVES_ALGORITHM / algorithm: 'hierarchical' needs ranks on "
                                   f"several hosts, the same number (more than one) on each, but {why_not} "
                                   "(use 'auto' or 'ring'; COLLECTIVES_HOSTS declares hosts on one machine)")


def mpi():
    """mpi4py's MPI module, MPI started (by this runtime where the program told mpi4py not to: then it also
    finalizes it at exit). Every use of the runtime that needs MPI comes here first: the first installs the
    hooks that see the process out (``life.install_hooks``); importing ``collectives`` alone does not."""
    with _starting_mpi:   # (two threads' first calls: the second waits for MPI the first is starting)
        if not mpi_running():   # (torchrun and the like: the world forms through torch's store first)
            rendezvous.form_world(config.setup_timeout())
        with launchers.bounded_mpi_init():   # (MPI_Init bounded by the runtime's timeout)
            from mpi4py import MPI   # (imported here: importing it starts MPI, unless the program told mpi4py not to)
            if MPI.Is_finalized():
                raise CollectiveError("MPI was already finalized in this process; the runtime cannot start")
            if not MPI.Is_initialized():
                MPI.Init_thread(MPI.THREAD_MULTIPLE)
                life.mpi_started_by_us()
        if life.first_time_mpi_started():   # (a death before it leaves this rank in MPI_Init: its supervisor ends it)
            supervision.tell(supervision.Word.STARTED)
        notices.hear_failure_notices()   # (from now, not from the setup; not before MPI starts: MPICH's handler ends us)
        life.install_hooks(_at_exit)
    return MPI


_starting_mpi = threading.RLock()   # (reentrant: a signal's handler may need MPI while its thread starts it)


def mpi_running() -> bool:
    """MPI is started and not finalized (never starting it: a program that did not is left alone)."""
    MPI = sys.modules.get("mpi4py.MPI")   # (maybe still being imported by another thread: MPI_Init under way)
    started, finalized = getattr(MPI, "Is_initialized", None), getattr(MPI, "Is_finalized", None)
    return started is not None and finalized is not None and started() and not finalized()


# The process's end, once the program has used the runtime (the hooks installed by mpi()).
_FAREWELL_SETUP_SECONDS = 10.0   # how long a process ending before setup waits to tell the others (docs/failures.md)


def _at_exit() -> None:
    """The exit handler: the farewell, then MPI's end where nobody else will see to it. (Python's
    exit handlers all run before mpi4py's own finalize.)"""
    try:
        _leave()
    finally:
        _finalize_if_nobody_will()


def _leave() -> None:
    """At exit, or inside ``MPI.Finalize()`` (the program's or the one at exit), whichever comes first: the farewell
    (``leaving.leave``, once), or, never set up, the setup joined to say why it ends. Then the hooks go."""
    try:
        if life.world is None:
            _leave_unset()
        else:
            leaving.leave(life.world, finishing=mpi_running())
    finally:
        life.remove_hooks()


def _leave_unset() -> None:
    """At exit of a process that used the runtime but never set it up, in a job of several ranks:
    join the setup for at most _FAREWELL_SETUP_SECONDS, saying why this process ends, so that
    ranks waiting in their first collective raise at once instead of at the timeout. Where no
    rank sets the runtime up, every rank does this together: one setup exchange at exit (a few
    milliseconds), up to _FAREWELL_SETUP_SECONDS where the ranks end that far apart."""
    if not mpi_running() or life.joined_setup or sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() < 2:
        return
    why = life.why_ending or config.ENDED
    try:
        set_up({}, "", left=why, timeout=_FAREWELL_SETUP_SECONDS)
    except (CollectiveError, CollectiveUsageError):
        pass   # nobody was waiting in setup (or they were told)


def _finalize_if_nobody_will() -> None:
    """At exit, after the farewell: finalize MPI if this runtime started it, or if the program told mpi4py
    not to (``mpi4py.rc.finalize = False``) and did not itself (without it MPICH's launcher kills the
    others), or where an uncaught Ctrl-C ends the process, which then outlasts the other ranks on its
    host (``leaving.outlast_host_mates``); not after a death before the setup or a setup that timed
    out (``leaving.end_unset``)."""
    if mpi_running() and life.world is None and (notices.failure_notices() or life.setup_missed
                                                 or life.setup_lost_a_process):
        leaving.end_unset(sys.modules["mpi4py.MPI"].COMM_WORLD.Get_rank(), life.setup_missed)
    interrupted = life.ends_interrupted and mpi_running() and sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() > 1
    if mpi_running() and (life.started_mpi or sys.modules["mpi4py"].rc.finalize is False or interrupted):
        sys.modules["mpi4py.MPI"].Finalize()
    if interrupted:   # (finalized now, not by mpi4py after every exit handler: it waits once MPI has ended)
        leaving.outlast_host_mates()


def abort(code: int = 1, grace: float = leaving.REPORT_GRACE_SECONDS) -> None:
    """End the whole job after a failure: tell every other rank that this one leaves and why (its
    farewell), give them ``grace`` seconds to report it, then abort every process of the job, so
    that a rank stuck outside the runtime (a stalled loop) cannot keep it alive for ever.

    >>> try:                                                   # doctest: +SKIP
    ...     train()
    ... except col.CollectiveError as e:
    ...     print(f"[rank {col.rank()}] error: {e}", file=sys.stderr, flush=True)
    ...     col.abort(1)
    """
    if life.world is not None:
        leaving.leave(life.world, finishing=False)
    time.sleep(grace)
    mpi().COMM_WORLD.Abort(code)
    os._exit(code)   # (MPICH's Abort has been seen to return when another process had already ended)
