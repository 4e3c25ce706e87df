"""The watch over one rank's MPI_Init: a small program of its own, started beside the rank by
``launchers.bounded_mpi_init`` (Python cannot act inside MPI_Init, and a fork of a process whose
other threads hold locks can deadlock in the child), on the standard library and
``ring.transport.host_waits`` only (the repository's root on PYTHONPATH):

    python -S init_watch.py SECONDS PID RANK LOCAL_RANKS LAUNCHER BOUND

It ends quietly as soon as its standard input closes (MPI_Init returned, or the rank died).
Otherwise it says why on stderr and SIGKILLs the rank GRACE_SECONDS later, so that every rank's
watch has spoken before the first end (MPICH's MPI_Init crashed on the others at once, before
their watches spoke), when

- SECONDS pass (BOUND names what set them: COLLECTIVES_TIMEOUT, or the least MPI's start is
  given): a process of the job has not started MPI, because it has not come to its first use of
  the runtime yet, or because it ended before it started MPI and the launcher never said so (srun
  ``--kill-on-bad-exit=0``, MPICH's mpiexec across the nodes of an allocation under
  ``-disable-auto-cleanup``);
- or, where the rank's parent is its launcher's proxy on this host (MPICH's ``hydra_pmi_proxy``,
  Slurm's ``slurmstepd``), which started the LOCAL_RANKS ranks here: one of them has ended and
  MPI_Init has not returned AFTER_A_MATE_SECONDS later. MPI_Init waits for every process of the
  job, and one that ended before it started MPI (a rank that only imported ``collectives``, or
  died first) never comes; the others waited the whole timeout (600 s by default) before.

It runs in a session of its own: MPICH's proxy signals a death to the rank's whole process group
(SIGUSR1, whose default action ends a process; the rank inside MPI_Init survives it, seen), and a
watch in that group would die of it, leaving its rank in MPI_Init for ever (salloc + mpiexec
-disable-auto-cleanup across nodes).
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

from ring.transport.host_waits import parent_of, siblings

#: Between the watch's line and its kill.
GRACE_SECONDS = 1.0
#: How long MPI_Init may go on once a process its launcher started beside it has ended (a process
#: that had passed MPI_Init with this one would have let it return within milliseconds).
AFTER_A_MATE_SECONDS = 5.0
#: The launchers' processes that start every rank of their host themselves.
PROXIES = ("hydra_pmi_proxy", "slurmstepd")


def ranks_started_here(pid: int, local_ranks: int) -> int | None:
    """How many of the ``local_ranks`` processes that the launcher's proxy started on this host
    still run, ``pid``'s included; None where ``pid``'s parent is not such a proxy (a shell
    wrapper, a supervisor) or there is nothing to count."""
    try:
        with open(f"/proc/{parent_of(pid)}/comm") as comm:
            name = comm.read().strip()
    except OSError:
        return None
    return len(siblings(pid)) + 1 if name in PROXIES and local_ranks > 1 else None


def watch(seconds: float, pid: int, rank: str, local_ranks: int, launcher: str,
          bound: str = "COLLECTIVES_TIMEOUT") -> None:
    """Watch MPI_Init of process ``pid`` (see the module); return once it has returned."""
    deadline = time.monotonic() + seconds
    ended_at = None
    while True:
        now = time.monotonic()
        until = deadline if ended_at is None else min(deadline, ended_at + AFTER_A_MATE_SECONDS)
        if now >= until:
            break
        if select.select([0], [], [], min(0.5, until - now))[0]:
            return   # (its standard input closed: MPI_Init returned, or the rank ended)
        if ended_at is None:
            running = ranks_started_here(pid, local_ranks)
            if running is not None and running < local_ranks:
                ended_at = time.monotonic()
    if ended_at is None or time.monotonic() >= deadline:
        why = (f"MPI_Init has not returned after {seconds:g} s ({bound}) under {launcher}: a process of this job "
               "has not started MPI: it has not come to its first use of the runtime yet, or it ended before "
               "starting MPI and the launcher never said so")
    else:
        why = (f"MPI_Init has not returned {AFTER_A_MATE_SECONDS:g} s after a process that {launcher} started on this "
               f"host ended ({local_ranks - (running or 0)} of its {local_ranks} here): MPI_Init waits for every "
               "process of the job, and one that ended without starting MPI (it only imported collectives, or "
               "died first) never comes")
    os.write(2, f"[rank {rank}] collectives: {why}; ending this process in {GRACE_SECONDS:g} s\n".encode())
    if not select.select([0], [], [], GRACE_SECONDS)[0]:
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    seconds, pid, rank, local_ranks, launcher, bound = sys.argv[1:7]
    watch(float(seconds), int(pid), rank, int(local_ranks), launcher, bound)
