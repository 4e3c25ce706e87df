"""How a process ends, decided from what happened: its exit status and its last line. Pure
functions, no clock and no MPI: the callers (``leaving``, ``collectives.elastic.supervisor``) find
out what happened, and print the line (``print_line``) and exit with the status these give.

- ``at_exit``: a rank that set the runtime up, at its farewell: MPI_Finalize as usual, or, where a
  rank will never come to it, an end without it (MPI_Finalize would wait for ever).
- ``never_set_up``: a rank whose runtime was never set up, after a death or a setup that timed out.
- ``supervised``: the supervisor of a rank (``collectives.elastic.supervisor``), once the rank ended
  or the supervisor ended it.

>>> at_exit(AtExit(rank=0))                  # every rank at the exit: MPI_Finalize, the program's status
Ending(status=None, line='')
>>> print(at_exit(AtExit(rank=1, gone=(3,), lost=(3,))).line)
[rank 1] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever for rank(s) 3 (gone)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from collectives.process.supervision import Heard


@dataclass(frozen=True)
class Ending:
    """The verdict: the exit status (None: the process goes on to MPI_Finalize, and exits as its
    program says) and the last line it says on stderr ("": none)."""
    status: int | None
    line: str = ""


@dataclass(frozen=True)
class AtExit:
    """What a rank knows at its farewell: ``why`` it leaves early ("": its program ended well), whether
    its elastic job's work was ``finished``, the ranks ``gone`` (that will not come to MPI_Finalize:
    they died, or left without it) among the ``lost`` (known dead), the ranks ``late`` at the exit
    barrier (not there ``patience`` seconds after this rank's failure), the ranks ``absent`` from it
    when a gone rank ended the wait early (not there yet), whether MPI_Finalize would
    follow (``finishing``) and whether MPI's world has processes gone or not there at the start
    (``outlived``)."""
    rank: int
    why: str = ""
    finished: bool = False
    gone: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    absent: tuple[int, ...] = ()
    patience: float = 0.0
    finishing: bool = True
    outlived: bool = False


def at_exit(what: AtExit) -> Ending:
    """A rank's end once its runtime was set up. Without MPI_Finalize where a rank is gone or late
    (status 1, but 0 where its elastic job finished and this rank leaves for no failure of its own:
    a death at the job's exit does not fail it; a late rank always fails it), or where MPI's world
    outlived a process (status 1 after a failure, else 0; no line: that is how such a job ends).

    >>> print(at_exit(AtExit(rank=1, gone=(3,), lost=(3,), finished=True)).line)
    [rank 1] collectives: exiting with status 0 (the elastic job finished) without MPI_Finalize, which would wait for ever for rank(s) 3 (gone)
    >>> at_exit(AtExit(rank=1, gone=(3,), lost=(3,), finished=True, why="uncaught KeyError")).status
    1
    >>> late = AtExit(rank=0, gone=(2,), late=(1,), patience=60, why="x")
    >>> print(at_exit(late).line)                                      # doctest: +NORMALIZE_WHITESPACE
    [rank 0] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever for rank(s)
    2 (leaving without it too) and 1 (not at exit 60 s after this rank's failure, its timeout: still in its own code?)
    >>> print(at_exit(AtExit(rank=0, gone=(1,), absent=(2,), why="x")).line)   # doctest: +NORMALIZE_WHITESPACE
    [rank 0] collectives: exiting with status 1 without MPI_Finalize, which would wait for ever for rank(s)
    1 (leaving without it too) and 2 (not at exit yet: still in its own code?)
    >>> at_exit(AtExit(rank=0, outlived=True)), at_exit(AtExit(rank=0, outlived=True, finishing=False))
    (Ending(status=0, line=''), Ending(status=None, line=''))
    """
    if what.gone or what.late:
        status = 1 if what.late or what.why or not what.finished else 0
        return Ending(status, _without_finalize(what, status))
    if what.finishing and what.outlived:
        return Ending(1 if what.why else 0)
    return Ending(None)


def _without_finalize(what: AtExit, status: int) -> str:
    dead = [r for r in what.gone if r in what.lost]
    leaving = [r for r in what.gone if r not in what.lost]
    whom = " and ".join(([f"{', '.join(map(str, dead))} (gone)"] if dead else []) +
                        ([f"{', '.join(map(str, leaving))} (leaving without it too)"] if leaving else []) +
                        ([f"{', '.join(map(str, what.late))} (not at exit {what.patience:g} s after this rank's "
                          "failure, its timeout: still in its own code?)"] if what.late else []) +
                        ([f"{', '.join(map(str, what.absent))} (not at exit yet: still in its own code?)"]
                         if what.absent else []))
    finished = " (the elastic job finished)" if status == 0 else ""
    return (f"[rank {what.rank}] collectives: exiting with status {status}{finished} without MPI_Finalize, which "
            f"would wait for ever for rank(s) {whom}")


def never_set_up(rank: int, missed: bool) -> Ending:
    """A rank whose runtime was never set up, after the launcher's notice that a process of the job
    ended before the setup, or (``missed``) after a setup that timed out: status 1, without MPI_Finalize.

    >>> print(never_set_up(2, missed=False).line)
    [rank 2] collectives: exiting with status 1 without MPI_Finalize: a process of this job ended before the runtime was set up, and MPI_Finalize would wait for it for ever
    """
    why = ("a rank of this job did not come to the runtime's setup, and after MPI_Finalize the launcher would wait "
           "for it as long as it runs" if missed else
           "a process of this job ended before the runtime was set up, and MPI_Finalize would wait for it for ever")
    return Ending(1, f"[rank {rank}] collectives: exiting with status 1 without MPI_Finalize: {why}")


def supervised(rank: str, status: int, heard: Heard, ended_because: str = "", finished_without_it: bool = False
               ) -> Ending:
    """The status a supervisor exits with, and its line: ``status`` is its rank's (128 + the signal that
    ended it); ``ended_because``: the supervisor ended the rank, saying why (status 0 where the rank
    had said its elastic job finished, else 1); ``finished_without_it``: the rank died of a signal in
    an elastic job that the others finished (status 0).

    >>> supervised("2", 137, Heard.of(b"me"))
    Ending(status=137, line='')
    >>> print(supervised("2", 137, Heard.of(b"me"), finished_without_it=True).line)
    [rank 2] collectives: the job finished without this rank (it died of signal 9): its status is 0
    >>> supervised("1", 0, Heard.of(b"mef"), ended_because="MPI_Finalize has not returned")
    Ending(status=0, line='[rank 1] collectives: MPI_Finalize has not returned; it ends')
    """
    if ended_because:
        return Ending(0 if heard.finalizing else 1, f"[rank {rank}] collectives: {ended_because}; it ends")
    if finished_without_it and awaits_the_others(status, heard):
        return Ending(0, f"[rank {rank}] collectives: the job finished without this rank (it died of signal "
                         f"{status - 128}): its status is 0")
    return Ending(status)


def awaits_the_others(status: int, heard: Heard) -> bool:
    """Whether a supervisor waits for the other ranks' word before it exits: its rank died of a
    signal (``status`` over 128) inside an elastic job.

    >>> [awaits_the_others(status, Heard.of(said)) for status, said in [(137, b"me"), (137, b"m"), (1, b"e")]]
    [True, False, False]
    """
    return status > 128 and heard.in_elastic_job


def print_line(line: str) -> None:
    """Print a verdict's ``line`` on stderr, if it has one, in one write: the ranks of a job share the
    launcher's stream, and a line written in two parts (Python's print writes the text, then the
    newline, each at once where stderr is unbuffered) ran into another rank's.

    >>> print_line("")   # (no line: nothing)
    """
    if line:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
