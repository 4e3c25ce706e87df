"""The job's outcome, told to every rank's supervisor (``collectives.elastic.supervisor``): a job
that went on without a dead rank and finished makes that rank's supervisor exit 0, not 137, and
a rank stuck in its own code after the others failed is ended by its own.

The word travels over TCP. Inside ``col.elastic.run`` every rank holds a connection to every other
rank's supervisor (``stand_by``), on which it says nothing until ``run`` returns (``b"0"``: the
job finished) or raises (``b"x"``, and the connection stays open until the process ends): the
words of ``collectives.process.supervision.Outcome``. For 3 ranks, after rank 2 is killed::

    rank 0 --- supervisor of 1          rank 0 and rank 1 go on, finish, each sends FINISHED
    rank 0 --- supervisor of 2          the supervisor of 2 reads FINISHED: it exits 0, not 137
    rank 1 --- supervisor of 0
    rank 1 --- supervisor of 2          (had both failed or died instead, their kernels would
    rank 2 --- supervisors of 0, 1       close both connections without FINISHED: it exits 137)

No timeout is needed: the dead rank's supervisor waits while a connection is open, and each closes
when the process holding it ends, however it ends.
"""
from __future__ import annotations

import contextlib
import select
import socket
from typing import Iterator, Sequence

from collectives.process import supervision
from collectives.process.life import life
from collectives.process.supervision import Outcome, own_port


def stand_by(hosts: Sequence[str], ports: Sequence[int]) -> None:
    """In the rank: hold a connection to the supervisor of every other rank of the world (world
    rank r on ``hosts[r]``, its supervisor listening on ``ports[r]``; 0: none), that it may hear
    this job's word if its rank dies (see ``report``). Connections made at an earlier
    change are kept; one that cannot be made is left out (that supervisor then reports its rank's
    own status). ``col.elastic.run`` calls it at the start and after every change."""
    mine = (socket.gethostname(), own_port())
    supervision.tell(supervision.Word.ELASTIC)
    for address in zip(hosts, ports):
        if address[1] and address != mine and address not in _standing_by:
            try:
                _standing_by[address] = socket.create_connection(address, timeout=_CONNECT_SECONDS)
            except OSError:
                pass


@contextlib.contextmanager
def reporting() -> Iterator[None]:
    """Around ``col.elastic.run``'s work: ``report(finished=True)`` once it returns, ``report(finished=False)``
    if it raises (a rank stuck in its own code is then ended by its supervisor)."""
    try:
        yield
    except BaseException:
        report(finished=False)
        raise
    report(finished=True)
    life.finish_work()


def report(finished: bool) -> None:
    """In the rank, when ``col.elastic.run`` returns (``finished``) or raises: tell every
    supervisor stood by. A supervisor whose rank died reports 0 for a finished job; one whose rank
    still runs once every other rank has ended after a failure ends it (``supervisor._watch``). After a
    failure the connections stay open until this process ends, however long its exit takes."""
    for connection in _standing_by.values():
        try:
            connection.sendall(Outcome.FINISHED if finished else Outcome.FAILED)
        except OSError:
            pass
    if finished:
        for connection in _standing_by.values():
            connection.close()
        _standing_by.clear()


_CONNECT_SECONDS = 5.0
_standing_by: dict[tuple[str, int], socket.socket] = {}   # (host, port) of a supervisor -> our connection


class TheOthers:
    """The supervisor's side of ``stand_by``: the connections of the other ranks, accepted as they
    come, and what they said before they closed."""

    def __init__(self, listener: socket.socket):
        listener.setblocking(False)
        self.listener, self.open, self.said, self.ever = listener, [], b"", False

    def look(self, seconds: float) -> None:
        """Accept new connections and read what has come, waiting up to ``seconds`` for a word."""
        try:
            while True:
                self.open.append(self.listener.accept()[0])
                self.ever = True
        except OSError:   # (BlockingIOError: none waiting)
            pass
        for connection in select.select(self.open, [], [], seconds)[0] if self.open else ():
            try:
                word = connection.recv(16)
            except OSError:
                word = b""
            self.said += word
            if not word:
                self.open.remove(connection)
                connection.close()

    def finished(self) -> bool:
        return Outcome.FINISHED in self.said

    def all_gone_after_a_failure(self) -> bool:
        """Every other rank that stood by has ended, one at least saying the job failed."""
        return self.ever and not self.open and Outcome.FAILED in self.said and not self.finished()


def await_word(others: TheOthers, look_seconds: float) -> bool:
    """The child died of a signal inside an elastic run: whether a rank says the job finished before
    every rank that stood by has ended without saying so (False at once if none did)."""
    while True:
        others.look(look_seconds)
        if others.finished():
            return True
        if not others.open:
            return False
