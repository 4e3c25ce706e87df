"""Leaving, as the transport sees it: the farewell every rank sends when it ends, the wait for the
others' at exit (so that MPI_Finalize never waits for a rank that died), and what ranks hand
rank 0 at exit (the timeline's events). A mixin of ``ring.transport.mpi.MPITransport``, over the
control channel of ``ring.transport.departures``."""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ring.transport.departures import AT_EXIT, EXIT_TAG, FAILED, LEFT, NOT_FINALIZING, ROOT
from ring.transport.polling import pause

_testall = MPI.Request.Testall


class AtExit:
    """The exit path of a transport that is also a ``Departures``."""

    def farewell(self, completed: int, why: str, failed: bool = False, root: bool = False,
                 finalizing: bool = True, dead: int | None = None, patience: float = 1.0) -> None:
        """Tell every other rank that this one is leaving, having completed ``completed``
        collectives, because ``why`` ("": its program ended), and whether it ``failed`` (then it is
        probably not the cause: waiting ranks name a rank that left of its own accord first),
        whether ``why`` is a ``root`` cause to pass on verbatim, and whether it is ``finalizing``.
        Waits at most ``patience`` seconds for the messages to leave (they are small: MPI sends
        them at once)."""
        flag = (FAILED if failed else 0) | (ROOT if root else 0) | (0 if finalizing else NOT_FINALIZING)
        self._note_dead(dead)
        if self.liveness is not None:
            self.liveness.goodbye()
        for peer in range(self.size):
            if peer != self.rank:
                self._control(peer, LEFT, completed, why, flag=flag, dead=dead)
        give_up = time.monotonic() + patience
        requests = [r for r, _ in self._control_out]
        while requests and not _testall(requests) and time.monotonic() < give_up:
            time.sleep(1e-3)

    def farewell_of(self, peer: int, deadline: float) -> str | None:
        """After this rank's own farewell: wait for ``peer``'s; return why it left ("": its program
        ended normally), or None if it died without one or the deadline passed."""
        while peer not in self.departed:
            self._read_control()
            if time.monotonic() >= deadline or peer in self.dead_peers():
                self._read_control()
                break
            time.sleep(1e-3)
        return self.departed[peer][2] if peer in self.departed else None

    def deliver_at_exit(self, data: bytes, deadline: float) -> bool:
        """At exit, after the farewells: hand ``data`` to rank 0 if it left normally (it then
        collects, see collect_at_exit); whether it was delivered by the deadline."""
        if self.farewell_of(0, deadline) != "":
            return False
        message = np.frombuffer(data, np.uint8)
        request = self.comm.Isend([message, MPI.BYTE], 0, EXIT_TAG)
        while not request.Test():
            if time.monotonic() >= deadline:
                self._abandoned.append(([request], message))
                return False
            time.sleep(1e-3)
        return True

    def collect_at_exit(self, deadline: float) -> list[bytes | None]:
        """Rank 0 at exit, after the farewells: what every other rank that left normally handed it
        (deliver_at_exit), by rank; None for a rank that left after a failure, died, or was late."""
        found: list[bytes | None] = [None] * self.size
        status = MPI.Status()
        for peer in range(1, self.size):
            if self.farewell_of(peer, deadline) != "":
                continue
            while not self.comm.Iprobe(peer, EXIT_TAG, status):
                if time.monotonic() >= deadline:
                    break
                time.sleep(1e-3)
            else:
                message = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                self.comm.Recv([message, MPI.BYTE], peer, EXIT_TAG)
                found[peer] = message.tobytes()
        return found

    def gone_at_exit(self) -> list[int]:
        """At exit: the ranks that will never call MPI_Finalize, as far as this rank knows (dead, or
        said so in their farewell), as ``names`` gives them."""
        self._read_control()
        return sorted(set(self.known_dead()) | {self.names[p] for p in self.unfinalized})

    def await_farewells(self, seconds: float) -> None:
        """Wait up to ``seconds`` until every other rank has said farewell or is dead: a launcher may
        end the job as soon as one process ends after a death (MPICH's does), so that the ranks
        still reporting what they saw would be cut short."""
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            self._read_control()
            dead = set(self.dead_peers())
            if all(p == self.rank or p in self.departed or p in dead for p in range(self.size)):
                return
            time.sleep(5e-3)

    def exit_barrier(self) -> list[int]:
        """At exit, before MPI_Finalize (which waits for every rank, for ever if one died): wait
        until every rank is at exit too; return [] then, or as soon as some rank is known never
        to finalize, those ranks (see gone_at_exit), so that this one can leave without it.

        A barrier of control messages (each rank tells every other that it is here), not MPI's
        Ibarrier: MPI pairs collectives by their order on a communicator, and a failure can leave
        ranks out of step there. A rank that comes late to a call the others abandoned finds their
        leftover messages disagree with its own, and starts the all-gather that reports a
        disagreement, which they never join; an Ibarrier then paired with that orphan on one rank,
        which went on into MPI_Finalize while the others waited in the barrier for ever."""
        for peer in range(self.size):
            if peer != self.rank:
                self._control(peer, AT_EXIT, 0)
        started = time.monotonic()
        while True:
            gone = self.gone_at_exit()   # (reads the control channel, so notes the others' AT_EXIT)
            if gone:
                return gone
            if len(self.at_exit) == self.size - 1 and _testall([r for r, _ in self._control_out]):
                return []   # (every rank is here, and has this one's messages: none is left unread)
            pause(time.monotonic() - started, 0.0, background=True)
