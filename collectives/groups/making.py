"""Making and freeing groups: the bodies of ``Group.split``, ``new_group`` and ``destroy``, the
collectives whose work is a communicator (see ``collectives.groups.group`` for what a group is)."""
from __future__ import annotations

from time import monotonic
from typing import Any, Callable

from collectives.calls import validate
from collectives.calls.call import Call, stopped
from collectives.calls.group_protocol import CallGroup
from collectives.calls.runtime import Runtime
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.groups.membership import NonMember
from collectives.calls.signature import disagreement, signature
from ring.doubling import SIGNATURE_BYTES
from ring.transport.base import Bound, CommunicatorsExhausted, MPIOnlyTransport, TransportError, TransportTimeout


def make_group(kind: type, runtime: Runtime, transport: MPIOnlyTransport, ranks: tuple[int, ...],
               world: bool = False) -> Any:
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


def new_group(call: Call, ranks: Any) -> Any:
    """``Group.new_group``'s body: every member of the parent group calls."""
    parent = call.group
    members = validate.members(call.name, "ranks", ranks, parent.ranks)
    call.agree(call.signature(shape=members), always=True)   # a split blocks inside MPI: every rank must come
    me = parent.ranks[parent.rank()]
    inside = me in members
    return _joined(call, lambda: parent.transport.split(0 if inside else None, members.index(me) if inside else 0),
                   members)


def made_by_members(parent: CallGroup, ranks: Any, timeout: Any) -> Any:
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
    # Judged as the parent's next call: a member that left (ended its program, raised, died) after
    # its last call on the parent can never come, and is named at once, not at the timeout.
    bound = Bound(parent.seq + 1, monotonic() + (runtime.settings.timeout if timeout is None else timeout),
                  runtime.stopped)
    try:
        mine = signature("new_group", 0, shape=members).ljust(SIGNATURE_BYTES, b"\0")
        said = parent.transport.among(places, mine, bound)
    except TransportError as e:
        failure = f"new_group (members_only=True) on {parent.where()}: {e}"
        if isinstance(e, TransportTimeout):
            failure += " (every rank in ranks must call new_group with members_only=True)"
        # (a late member's list may still come: out of step)
        raise CollectiveError(runtime.stop(failure, e, by_peer=True)) from e
    if len(set(said)) > 1:
        raise CollectiveUsageError(disagreement("new_group", said, tuple(parent.ranks[p] for p in places),
                                                parent.label))
    try:
        made = parent.transport.subset(indices)
    except CommunicatorsExhausted as e:
        raise CollectiveError(f"new_group: MPI has no communicators left; destroy groups you no longer use [{e}]") \
            from e
    return make_group(type(parent), parent.runtime, made, members)


def agreed(call: Call, members: tuple[int, ...]) -> Any:
    """The first call on a group made by its members alone: they check that they agree on it."""
    call.agree(call.signature(shape=members), always=True)
    return call.group


def split(call: Call, color: Any, key: Any) -> Any:
    """``Group.split``'s body."""
    validate.color(call.name, color)
    validate.integer(call.name, "key", key)
    call.agree(call.signature(), always=True)   # (as in new_group)
    return _joined(call, lambda: call.group.transport.split(color, int(key)), ())


def _joined(call: Call, split: Callable, members: tuple[int, ...]) -> Any:
    """The group on the transport ``split()`` makes, or, for a rank left out (None), its marker.
    MPI running out of communicators fails alike on every rank (the new one's context id is agreed
    by all): a CollectiveError that leaves the ranks in step, so that destroying groups helps."""
    parent, made = call.group, None
    call.runtime.grouped = True
    try:
        made = split()
        if made is None:
            return NonMember(members, parent.ranks[parent.rank()])
        return make_group(type(parent), call.runtime, made, tuple(made.names))
    except CommunicatorsExhausted as e:
        if made is not None:
            made.close()
        call.in_step = True   # (MPI refused alike on every rank)
        alive = len(call.runtime.groups) - 1
        raise CollectiveError(f"{call.name}: MPI has no communicators left ({alive} groups alive); destroy groups "
                              f"you no longer use (Group.destroy()) [{e}]") from e


def destroy(call: Call) -> None:
    """``Group.destroy``'s body."""
    if call.group.is_world:
        validate.fail(call.name, "group", "is the world, which lives as long as the runtime; give a group "
                                          "made by new_group or split")
    call.agree(call.signature(), always=True)   # every member is here: none has a call in flight on it
    call.group.destroyed_now()
