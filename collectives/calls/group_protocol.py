"""What the call machinery needs of the group a call runs on, declared on the calls' own floor.

``collectives.groups.group.Group`` is the one kind of group; it sits on a floor above the calls,
so the calls (``call.py``) and the runtime (``runtime.py``) name it by this protocol instead of
importing it: a reader sees here every member of a group that they use.
"""
from __future__ import annotations

from typing import Protocol

from collectives.calls.runtime import Runtime
from ring.transport.base import MPIOnlyTransport


class HostTransports(Protocol):
    """What a call needs of a group's host transports together (``collectives.groups.transports``)."""

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what the host transports still have posted."""


class CallGroup(Protocol):
    """A group as its calls and the runtime see it (``collectives.groups.group.Group``)."""

    runtime: Runtime              # what the process's groups share: settings, engine, failure state
    transport: MPIOnlyTransport   # the group's host transport: its calls' messages, control plane, farewells
    transports: HostTransports    # the host transport and its two levels, abandoned together
    ranks: tuple[int, ...]        # the members' world ranks, in group order
    label: str                    # how messages name the group ("" for the world)
    seq: int                      # the group's calls so far (its own to count: next_call)
    last: object                  # the last of them (a Call), None before the first
    is_world: bool
    destroyed: bool

    def rank(self) -> int:
        """This process's rank in the group."""

    def where(self) -> str:
        """This rank as messages name it."""

    def next_call(self, call: object) -> int:
        """The number of ``call``, now made on this group."""

    def give_up(self, why: str, failed: bool = False, root: bool = False, dead: int | None = None) -> None:
        """The runtime stopped on this rank: tell the other members after which call."""
