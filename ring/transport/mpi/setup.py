"""Setting up the runtime's transport: a private duplicate of the world's communicator, every
rank's host, process and setup record, and a first message to every rank on another host."""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ring.transport.mpi import liveness as liveness_watch
from ring.transport.base import PeerLost, TransportError, TransportTimeout
from ring.transport.mpi.notices import NoticeWatch, failure_notices
from ring.transport.mpi.transport import MPITransport
from ring.transport.host_waits import pause, siblings

_HELLO_TAG = 10  # the setup's empty messages across hosts (see _connect_across_hosts)
_SETUP_RECORD_BYTES = 1024
_SEGMENTS = "/dev/shm/mpich_shm_"   # (MPICH's shared-memory segments, as a process's memory map names them)
_testall = MPI.Request.Testall


def connect(timeout: float, record: bytes, comm: MPI.Comm | None = None,
            notices_before: int | None = None, local_ranks: int = 0) -> tuple[MPITransport, list[bytes]]:
    """Set up the runtime's private communicator, a duplicate of ``comm`` (default: every rank,
    MPI.COMM_WORLD), bounded by ``timeout`` seconds, and exchange ``record`` (at most 1 KiB: the
    settings, or a problem found on this rank). A launcher's failure notice beyond the first
    ``notices_before`` (default: those heard so far) ends it (see ``_wait_setup``), and so does,
    where ``local_ranks`` (more than 1) ranks of ``comm`` were started on this host as this
    process's siblings (``launchers.started_under_proxy``), one of them that has ended.

    Returns the transport and every rank's record. Nothing here blocks inside MPI, so a rank
    that never comes makes the others raise TransportTimeout instead of waiting for ever.
    """
    if len(record) > _SETUP_RECORD_BYTES:
        raise ValueError(f"setup record of {len(record)} bytes; at most {_SETUP_RECORD_BYTES}")
    began = time.monotonic()
    deadline = began + timeout
    heeded = failure_notices() if notices_before is None else notices_before
    watch = _Watch(heeded, local_ranks)
    whole_world = _has_every_process(comm or MPI.COMM_WORLD)
    comm, request = (comm or MPI.COMM_WORLD).Idup()   # a private duplicate: our messages never match the user's
    _wait_setup([request], began, deadline, watch, "make the runtime's communicator", comm)
    liveness = liveness_watch.Liveness()
    host = socket.gethostname().encode()[:200]
    mine = np.zeros(16 + 256 + _SETUP_RECORD_BYTES, np.uint8)
    mine[:16] = np.frombuffer(np.array([os.getpid(), liveness.port], np.int64).tobytes(), np.uint8)
    mine[16:16 + len(host)] = np.frombuffer(host, np.uint8)
    mine[272:272 + len(record)] = np.frombuffer(record, np.uint8)
    every = np.empty((comm.Get_size(), mine.size), np.uint8)
    try:
        _wait_setup([comm.Iallgather(mine, every)], began, deadline, watch, "exchange the settings", comm, mine, every)
    except TransportError:
        liveness.close()
        raise
    if whole_world:   # (every process of MPI's world is past MPI_Init: each has attached MPICH's segments)
        unlink_shared_memory_names()
    pids, ports = np.frombuffer(every[:, :16].tobytes(), np.int64).reshape(-1, 2).T.tolist()
    hosts = [row[16:272].tobytes().rstrip(b"\0").decode(errors="replace") for row in every]
    records = [row[272:].tobytes().rstrip(b"\0") for row in every]
    rank = comm.Get_rank()
    liveness.join(rank, hosts, ports)
    _connect_across_hosts(comm, rank, hosts, began, deadline, watch)
    return MPITransport(comm, hosts, pids, liveness=liveness, owns_liveness=True), records


def _has_every_process(comm: MPI.Comm) -> bool:
    """Whether ``comm`` has every process of this one's MPI_COMM_WORLD: the world or a duplicate of it,
    or the communicator an elastic job's newcomers join (their world is the processes spawned with
    them); not a part of the world (``init(comm=...)`` on a split)."""
    world, ours = MPI.COMM_WORLD.Get_group(), comm.Get_group()
    try:
        return MPI.UNDEFINED not in world.Translate_ranks(list(range(world.Get_size())), ours)
    finally:
        world.Free()
        ours.Free()


def unlink_shared_memory_names(maps: str = "/proc/self/maps") -> list[str]:
    """Unlink the names of MPICH's shared-memory segments this process maps (``/dev/shm/mpich_shm_*``:
    MPI_Init's, which MPICH itself unlinks only in MPI_Finalize), once every process of the host has
    attached them; return the names unlinked. The memory stays mapped as long as a process uses it,
    and goes with the last; a process that ends without MPI_Finalize (killed, or leaving without it
    after a failure: ``collectives.process.ending``) no longer leaves its segment in /dev/shm, a few
    MB, until the machine restarts. Another process of the host may have unlinked a name first.

    >>> unlink_shared_memory_names("/nonexistent")
    []
    """
    try:
        with open(maps) as lines:
            names = {line.split(None, 5)[5].rstrip("\n") for line in lines if _SEGMENTS in line}
    except OSError:
        return []
    unlinked = []
    for name in sorted(names):
        if name.endswith(" (deleted)"):
            continue
        try:
            os.unlink(name)
            unlinked.append(name)
        except OSError:
            pass
    return unlinked


def _connect_across_hosts(comm: MPI.Comm, rank: int, hosts: Sequence[str], began: float, deadline: float,
                          watch: _Watch) -> None:
    """Exchange an empty message with every rank on another host, so that MPI connects to each now,
    while all are alive: a first message to a rank whose host had since gone was seen to block
    inside MPI (libfabric's tcp connecting) for minutes, out of reach of every deadline."""
    others = [peer for peer in range(len(hosts)) if hosts[peer] != hosts[rank]]
    if not others:
        return
    empty = np.zeros(0, np.uint8)
    requests = [comm.Irecv([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    requests += [comm.Isend([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    _wait_setup(requests, began, deadline, watch, "connect to the ranks on other hosts", empty)


_unfinished_setups: list = []   # requests of a setup that timed out, kept with their buffers for good
_LOOK_SECONDS = 0.1   # how often a setup's wait looks at this host's other ranks (/proc)


class _Watch:
    """What ends a setup's wait early: more than ``heeded`` failure notices from the launcher, or fewer
    than ``local_ranks - 1`` siblings (the other ranks started on this host) still running."""

    def __init__(self, heeded: int, local_ranks: int):
        self.notices, self.local_ranks, self.next_look = NoticeWatch(heeded), local_ranks, 0.0

    def ended(self, now: float, what: str) -> str:
        """Why the setup cannot complete ("": it may): before the exchange nobody knows the others'
        processes, so a launcher's notice, or a sibling's end, is the only word of one gone."""
        word = ""
        if self.notices.grace_over(now):
            word = "mpiexec's failure notice (SIGUSR1) came while this rank waited; which rank it was"
        elif self.local_ranks > 1 and now >= self.next_look:
            self.next_look = now + _LOOK_SECONDS
            gone = self.local_ranks - 1 - len(siblings())
            if gone > 0:
                word = (f"{gone} of the {self.local_ranks} processes the launcher started on this host "
                        f"{'has' if gone == 1 else 'have'} ended (given up waiting for this rank, or died); which rank")
        return (f"a process of this job ended before every rank could {what}: {word} cannot be known before the "
                "setup's exchange") if word else ""


def _wait_setup(requests: list[MPI.Request], began: float, deadline: float, watch: _Watch, what: str,
                *buffers: Any) -> None:
    """Poll until ``requests`` are done, the deadline passes, or ``watch`` finds a process of the job
    gone (without it the others would wait for the whole timeout). A timeout says the time since
    the setup ``began``: its deadline bounds the whole setup, not this wait."""
    started = time.monotonic()
    while not _testall(requests):
        now = time.monotonic()
        gone = watch.ended(now, what)
        if gone or now >= deadline:
            # A nonblocking collective cannot be cancelled: keep it, and what it writes into, alive.
            _unfinished_setups.append((requests, buffers))
            if gone:
                raise PeerLost(-1, gone)   # (which rank: unknown)
            raise TransportTimeout(-1, now - began, f"every rank to {what} (a rank has not called "
                                                      "into the runtime yet, or will not)")
        pause(now - started, 0.0)
