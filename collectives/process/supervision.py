"""The supervisor's protocol: what a rank says to the parent process that stands between it and
MPICH's launcher (``collectives.elastic.supervisor``), and what the ranks of an elastic job say to
each other's supervisors when the job ends (``collectives.elastic.outcome``). Both sides use these
names; no other module writes or reads the bytes.

A rank tells its own supervisor of four moments of its life, one byte each on a pipe (the
descriptor and the rank's pid are in ``PIPE``, set by ``supervise`` in the rank): each is said at
most once, and the supervisor only ever asks which it has heard (``Heard``):

==============  ==========================================  =================================================
word            who says it, when                           what the supervisor does once it has heard it
==============  ==========================================  =================================================
``STARTED``     ``world.mpi`` (``changes.mpi_started``),    no longer ends the rank for a death seen before
                once MPI_Init has returned                  (a failure notice, an ended sibling): MPI_Init
                                                            is no longer where the rank would wait for ever
``ELASTIC``     ``outcome.stand_by``: the rank is inside    if the rank dies of a signal, waits for the other
                ``col.elastic.run``                         ranks' word (``Outcome``): 0 if they finished
``SPAWNED``     ``changes.spawned_here``: the job spawned   as ``ELASTIC``; a newcomer is not ended for being
                newcomers, or this newcomer joined (the     late to join; outlives the rank by a moment (the
                last word: the pipe closes)                 launcher must not die of its own notices)
``FINALIZING``  ``leaving.leave``: into MPI_Finalize, the   ends the rank, status 0, a grace after a rank of
                elastic job finished                        its host ended (MPI_Finalize would wait for ever)
==============  ==========================================  =================================================

>>> heard = Heard.of(Word.STARTED + Word.ELASTIC)
>>> heard.started, heard.in_elastic_job, heard.finalizing
(True, True, False)
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass

#: Set by ``collectives.elastic.supervisor.supervise`` in the rank: ``fd:pid``, the pipe on which the
#: rank (that pid, not a process it started) tells its supervisor each ``Word``.
PIPE = "COLLECTIVES_SUPERVISOR_FD"
#: Set beside ``PIPE``: ``port:pid``, where the rank's supervisor listens for the other ranks' ``Outcome``.
PORT = "COLLECTIVES_SUPERVISOR_PORT"


class Word(bytes, enum.Enum):
    """What a rank tells its own supervisor (the table above says who, when, and what follows)."""
    STARTED = b"m"
    ELASTIC = b"e"
    SPAWNED = b"1"
    FINALIZING = b"f"


class Outcome(bytes, enum.Enum):
    """What each rank of an elastic job tells every other rank's supervisor, over TCP, as
    ``col.elastic.run`` ends: ``FINISHED`` (it returned: a supervisor whose rank died of a signal
    exits 0) or ``FAILED`` (it raised: a rank still running once every other rank has ended is
    ended by its supervisor). A connection that closes without a word: that rank died."""
    FINISHED = b"0"
    FAILED = b"x"


@dataclass(frozen=True)
class Heard:
    """What a supervisor has heard from its rank so far (``of`` the bytes read from the pipe).

    >>> Heard.of(b"")
    Heard(started=False, elastic=False, spawned=False, finalizing=False)
    >>> Heard.of(Word.SPAWNED).in_elastic_job      # a newcomer, or a job that grew: elastic too
    True
    """
    started: bool
    elastic: bool
    spawned: bool
    finalizing: bool

    @classmethod
    def of(cls, said: bytes) -> Heard:
        return cls(Word.STARTED in said, Word.ELASTIC in said, Word.SPAWNED in said, Word.FINALIZING in said)

    @property
    def in_elastic_job(self) -> bool:
        """The rank runs an elastic job: its death of a signal waits for the others' ``Outcome``."""
        return self.elastic or self.spawned


def tell(word: Word, last: bool = False) -> None:
    """In the rank: say ``word`` to this process's supervisor, if it has one (nothing otherwise, and
    nothing in a process that inherited the variable from a supervised one); ``last``: then close the pipe.

    >>> tell(Word.STARTED)      # not supervised here: nothing happens
    """
    fd, _, pid = os.environ.get(PIPE, "").partition(":")
    if not (fd.isdigit() and pid == str(os.getpid())):
        return
    try:
        os.write(int(fd), word)
        if last:
            os.environ.pop(PIPE)
            os.close(int(fd))
    except OSError:
        pass


def own_port() -> int:
    """In the rank: the port on which this process's supervisor listens for ``Outcome`` (0: it has none).

    >>> own_port()
    0
    """
    port, _, pid = os.environ.get(PORT, "").partition(":")
    return int(port) if port.isdigit() and pid == str(os.getpid()) else 0
