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
from ring.transport.base import TransportError, TransportTimeout
from ring.transport.mpi.notices import NoticeWatch, failure_notices
from ring.transport.mpi.transport import MPITransport
from ring.transport.host_waits import pause

_HELLO_TAG = 10  # the setup's empty messages across hosts (see _connect_across_hosts)
_SETUP_RECORD_BYTES = 1024
_testall = MPI.Request.Testall


def connect(timeout: float, record: bytes, comm: MPI.Comm | None = None,
            notices_before: int | None = None) -> tuple[MPITransport, list[bytes]]:
    """Set up the runtime's private communicator, a duplicate of ``comm`` (default: every rank,
    MPI.COMM_WORLD), bounded by ``timeout`` seconds, and exchange ``record`` (at most 1 KiB: the
    settings, or a problem found on this rank). A launcher's failure notice beyond the first
    ``notices_before`` (default: those heard so far) ends it (see ``_wait_setup``).

    Returns the transport and every rank's record. Nothing here blocks inside MPI, so a rank
    that never comes makes the others raise TransportTimeout instead of waiting for ever.
    """
    if len(record) > _SETUP_RECORD_BYTES:
        raise ValueError(f"setup record of {len(record)} bytes; at most {_SETUP_RECORD_BYTES}")
    deadline = time.monotonic() + timeout
    heeded = failure_notices() if notices_before is None else notices_before
    comm, request = (comm or MPI.COMM_WORLD).Idup()   # a private duplicate: our messages never match the user's
    _wait_setup([request], deadline, heeded, "make the runtime's communicator", comm)
    liveness = liveness_watch.Liveness()
    host = socket.gethostname().encode()[:200]
    mine = np.zeros(16 + 256 + _SETUP_RECORD_BYTES, np.uint8)
    mine[:16] = np.frombuffer(np.array([os.getpid(), liveness.port], np.int64).tobytes(), np.uint8)
    mine[16:16 + len(host)] = np.frombuffer(host, np.uint8)
    mine[272:272 + len(record)] = np.frombuffer(record, np.uint8)
    every = np.empty((comm.Get_size(), mine.size), np.uint8)
    try:
        _wait_setup([comm.Iallgather(mine, every)], deadline, heeded, "exchange the settings", comm, mine, every)
    except TransportError:
        liveness.close()
        raise
    pids, ports = np.frombuffer(every[:, :16].tobytes(), np.int64).reshape(-1, 2).T.tolist()
    hosts = [row[16:272].tobytes().rstrip(b"\0").decode(errors="replace") for row in every]
    records = [row[272:].tobytes().rstrip(b"\0") for row in every]
    rank = comm.Get_rank()
    liveness.join(rank, hosts, ports)
    _connect_across_hosts(comm, rank, hosts, deadline, heeded)
    return MPITransport(comm, hosts, pids, liveness=liveness, owns_liveness=True), records


def _connect_across_hosts(comm: MPI.Comm, rank: int, hosts: Sequence[str], deadline: float, heeded: int) -> None:
    """Exchange an empty message with every rank on another host, so that MPI connects to each now,
    while all are alive: a first message to a rank whose host had since gone was seen to block
    inside MPI (libfabric's tcp connecting) for minutes, out of reach of every deadline."""
    others = [peer for peer in range(len(hosts)) if hosts[peer] != hosts[rank]]
    if not others:
        return
    empty = np.zeros(0, np.uint8)
    requests = [comm.Irecv([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    requests += [comm.Isend([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    _wait_setup(requests, deadline, heeded, "connect to the ranks on other hosts", empty)


_unfinished_setups: list = []   # requests of a setup that timed out, kept with their buffers for good


def _wait_setup(requests: list[MPI.Request], deadline: float, heeded: int, what: str, *buffers: Any) -> None:
    """Poll until ``requests`` are done, the deadline passes, or the launcher has told this process
    that another of the job died (more than ``heeded`` notices, see
    ``ring.transport.mpi.notices.NoticeWatch``) and the setup still has not ended soon after: before
    the exchange nobody knows the others' processes, so that notice is the only word of a death
    here (without it the survivors would wait for the whole timeout)."""
    started, notices = time.monotonic(), NoticeWatch(heeded)
    while not _testall(requests):
        now = time.monotonic()
        if notices.grace_over(now) or now >= deadline:
            # A nonblocking collective cannot be cancelled: keep it, and what it writes into, alive.
            _unfinished_setups.append((requests, buffers))
            if now < deadline:
                raise TransportError(f"a process of this job ended before every rank could {what}: mpiexec's "
                                     "failure notice (SIGUSR1) came while this rank waited; which rank it was "
                                     "cannot be known before the setup's exchange")
            raise TransportTimeout(-1, now - started, f"every rank to {what} (a rank has not called "
                                                      "into the runtime yet, or will not)")
        pause(now - started, 0.0)


