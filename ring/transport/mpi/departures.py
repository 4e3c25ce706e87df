"""Which rank a call names when others have left (their farewell) or given up (their runtime stopped)
before it: a pure verdict from what they said, which the control plane (``ring.transport.mpi.control``)
keeps as ``{rank: (after another's failure?, collectives completed, why)}``. No MPI here."""
from __future__ import annotations

from typing import Callable

from ring.transport.base import PeerLost

Said = dict[int, tuple[bool, int, str]]


def first_gone(said: Said, counts: Callable[[int, int], bool]) -> tuple[int, int, str] | None:
    """Of the ranks in ``said`` that ``counts(rank, completed)`` accepts, the one to name, with its count
    and why: one that stopped on its own account before one that stopped after a failure (which the
    first probably caused), then the one that completed fewest calls, then one that left for a reason
    (an uncaught exception) before one that ended its program (a wait for a message from any rank
    that both could have sent fails because of the first), then the lowest rank.

    >>> said = {1: (True, 3, "it stopped after a failure: ..."), 2: (False, 4, "uncaught ValueError")}
    >>> first_gone(said, lambda rank, completed: completed < 5)
    (2, 4, 'uncaught ValueError')
    >>> first_gone(said, lambda rank, completed: completed < 4)
    (1, 3, 'it stopped after a failure: ...')
    >>> first_gone(said, lambda rank, completed: completed < 3) is None
    True
    >>> first_gone({1: (False, 0, ""), 2: (False, 0, "uncaught RuntimeError: a bug")}, lambda rank, completed: True)
    (2, 0, 'uncaught RuntimeError: a bug')
    """
    gone = [(failed, completed, not why, rank, why) for rank, (failed, completed, why) in said.items()
            if counts(rank, completed)]
    if not gone:
        return None
    _, completed, _, rank, why = min(gone)
    return rank, completed, why


def lost(name: int, completed: int, why: str, gave_up: bool, root: bool = False, dead: int | None = None) -> PeerLost:
    """The error naming rank ``name``, which left (its farewell) or ``gave_up`` (its runtime stopped)
    after ``completed`` calls because of ``why``; ``root``: ``why`` is a rank's death (``dead``), as
    every rank should hear it, so it is passed on as it is.

    >>> print(lost(0, 1, "allreduce #2 on rank 0: timed out after 2 s waiting for rank 1", gave_up=True))
    rank 0 gave up (its runtime stopped after 1 collective(s) of this group): allreduce #2 on rank 0: timed out after 2 s waiting for rank 1
    >>> print(lost(1, 3, "uncaught RuntimeError: user bug", gave_up=False))
    rank 1 left: uncaught RuntimeError: user bug (after 3 collective(s))
    >>> print(lost(1, 3, "", gave_up=False))
    rank 1 ended its program after 3 collective(s)
    """
    if root:
        return PeerLost(name, why, root=why, dead=dead, said=True)
    if gave_up:
        return PeerLost(name, f"rank {name} gave up (its runtime stopped after {completed} collective(s) of this "
                              f"group): {why}", said=True)
    return PeerLost(name, f"rank {name} left: {why} (after {completed} collective(s))" if why else
                    f"rank {name} ended its program after {completed} collective(s)", said=True)
