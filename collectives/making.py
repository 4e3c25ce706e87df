"""Making and freeing groups: ``split``, ``new_group`` and ``destroy``, the collectives whose
work is a communicator (see ``collectives.group`` for what a group is)."""
from __future__ import annotations

from time import monotonic
from typing import Any, Callable

from collectives import validate
from collectives.call import Call, issue, stopped
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.membership import NonMember
from collectives.signature import disagreement, signature
from ring.doubling import SIGNATURE_BYTES
from ring.transport.base import CommunicatorsExhausted, TransportError, TransportTimeout


class GroupMaking:
    """The methods of ``collectives.group.Group`` that make groups from it, or free it."""

    def split(self, color: int | None, key: int = 0, *, timeout: float | None = None,
              name: str | None = None) -> Any:
        """Split this group into groups by ``color``, as MPI's Comm_split: every member calls it, and
        the ranks that pass the same color form one group, ordered by ``key``, then by rank.

        ``color``: an int >= 0, or None for no group (the rank gets a falsy ``NonMember``).

        >>> rows = col.split(col.rank() // 2)     # 4 ranks: [0, 1] and [2, 3]   # doctest: +SKIP
        >>> cols = col.split(col.rank() % 2)      #          [0, 2] and [1, 3]   # doctest: +SKIP
        """
        return issue(self, "split", _split, (color, key), False, timeout, name)

    def new_group(self, ranks, *, members_only: bool = False, timeout: float | None = None,
                  name: str | None = None) -> Any:
        """Make a group of the world ranks ``ranks`` (members of this group), in that order (group
        rank i is ``ranks[i]``).

        Every member of this group calls it with the same list; members of the new group get the
        :class:`Group`, the others a falsy ``NonMember``. With ``members_only=True`` only the
        new group's members call it (MPI's Comm_create_group: the others go on with other
        calls), and check on the new group that they agree; that making blocks inside MPI until
        every member has called (as torch.distributed's backends do). Ranks that disagree about
        the list, or a rank making another call, make every rank raise CollectiveUsageError (this
        check is made even with COLLECTIVES_CHECK=0).

        >>> evens = col.new_group(range(0, col.size(), 2))   # doctest: +SKIP
        >>> if evens:                                        # doctest: +SKIP
        ...     evens.allreduce(x)
        """
        if members_only is True:
            made = self.runtime.engine.run_now(_made_by_members, self, ranks, timeout)
            return issue(made, "new_group", _agreed, (made.ranks,), False, timeout, name)
        return issue(self, "new_group", _new_group, (ranks,), False, timeout, name)

    def destroy(self, *, timeout: float | None = None, name: str | None = None) -> None:
        """Free this group's communicators; every member calls it, as MPI_Comm_free and torch's
        ``destroy_process_group``. Afterwards any call on the group raises CollectiveUsageError.
        MPI has a few thousand communicators per process (MPICH: 2048): a program that makes groups
        in a loop destroys the ones it no longer uses.

        >>> pair = col.new_group([0, 1])                     # doctest: +SKIP
        >>> if pair:                                         # doctest: +SKIP
        ...     pair.allreduce(x); pair.destroy()
        """
        return issue(self, "destroy", _destroy, (), False, timeout, name)


def make_group(kind: type, runtime, transport, ranks: tuple[int, ...], world: bool = False) -> Any:
    """A group over ``transport`` with the two levels of the hierarchical all-reduce when it
    can take that path (every member must call this together: it makes communicators)."""
    hosts = runtime.two_level_hosts(transport, ranks, world)
    levels = None
    if hosts is not None:
        here = hosts[transport.rank]
        on_host = [r for r in range(len(hosts)) if hosts[r] == here]
        host_order = list(dict.fromkeys(hosts))
        local = transport.split(host_order.index(here), transport.rank, watched=True)
        across = transport.split(on_host.index(transport.rank), host_order.index(here), watched=True)
        levels = (local, across)
    return kind(runtime, transport, ranks, world, levels)


def _new_group(call: Call, ranks: Any) -> Any:
    parent = call.group
    try:
        members = validate.members(call.name, "ranks", ranks, parent.ranks)
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(shape=members), always=True)   # a split blocks inside MPI: every rank must come
    me = parent.ranks[parent.rank()]
    inside = me in members
    return _joined(call, lambda: parent.transport.split(0 if inside else None, members.index(me) if inside else 0),
                   members)


def _made_by_members(parent, ranks: Any, timeout: Any) -> Any:
    """The group of ``ranks`` (world ranks, members of ``parent``), made by them alone: a usage
    error on this rank if it is not one of them (nobody waits for it). The members first tell
    each other their lists, so that lists in different orders raise on every member instead of
    making two different groups (MPI's Comm_create_group does not check)."""
    runtime = parent.runtime
    if runtime.failure is not None:
        raise stopped("new_group", runtime)
    members = validate.members("new_group", "ranks", ranks, parent.ranks)
    if timeout is not None:
        validate.timeout("new_group", timeout)
    me = parent.ranks[parent.rank()]
    if me not in members:
        validate.fail("new_group", "ranks", f"with members_only=True only the members call, and rank {me} is "
                                            f"not one of {list(members)}")
    indices = [parent.ranks.index(r) for r in members]
    places = sorted(indices)
    deadline = monotonic() + (runtime.settings.timeout if timeout is None else timeout)
    try:
        mine = signature("new_group", 0, shape=members).ljust(SIGNATURE_BYTES, b"\0")
        said = parent.transport.among(places, mine, deadline)
    except TransportError as e:
        failure = f"new_group (members_only=True) on {parent.where()}: {e}"
        if isinstance(e, TransportTimeout):
            failure += " (every rank in ranks must call new_group with members_only=True)"
        runtime.note_failure(failure, e, by_peer=True)   # (a late member's list may still come: out of step)
        raise CollectiveError(failure) from e
    if len(set(said)) > 1:
        raise CollectiveUsageError(disagreement("new_group", said, tuple(parent.ranks[p] for p in places),
                                                parent.label))
    try:
        made = parent.transport.subset(indices)
    except CommunicatorsExhausted as e:
        raise CollectiveError(f"new_group: MPI has no communicators left; destroy groups you no longer use [{e}]") \
            from e
    return make_group(type(parent), parent.runtime, made, members)


def _agreed(call: Call, members: tuple[int, ...]) -> Any:
    """The first call on a group made by its members alone: they check that they agree on it."""
    call.agree(call.signature(shape=members), always=True)
    return call.group


def _split(call: Call, color: Any, key: Any) -> Any:
    try:
        validate.color(call.name, color)
        validate.integer(call.name, "key", key)
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(), always=True)   # (as in new_group)
    return _joined(call, lambda: call.group.transport.split(color, int(key)), ())


def _joined(call: Call, split: Callable, members: tuple[int, ...]) -> Any:
    """The group on the transport ``split()`` makes, or, for a rank left out (None), its marker.
    MPI running out of communicators fails alike on every rank (the new one's context id is agreed
    by all): a CollectiveError that leaves the ranks in step, so that destroying groups helps."""
    parent, made = call.group, None
    try:
        made = split()
        if made is None:
            return NonMember(members, parent.ranks[parent.rank()])
        return make_group(type(parent), call.runtime, made, tuple(made.names))
    except CommunicatorsExhausted as e:
        if made is not None:
            made.close()
        parent.completed = parent.seq
        alive = len(call.runtime.groups) - 1
        raise CollectiveError(f"{call.name}: MPI has no communicators left ({alive} groups alive); destroy groups "
                              f"you no longer use (Group.destroy()) [{e}]") from e


def _destroy(call: Call) -> None:
    try:
        if call.group.is_world:
            validate.fail(call.name, "group", "is the world, which lives as long as the runtime; give a group "
                                              "made by new_group or split")
    except CollectiveUsageError as error:
        call.reject(error)
    call.agree(call.signature(), always=True)   # every member is here: none has a call in flight on it
    call.group.release()
