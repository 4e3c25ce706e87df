"""How groups are named in messages, and what a rank left out of a group holds instead."""
from __future__ import annotations

from collectives.calls.table import BY_NAME
from collectives.errors import CollectiveUsageError

_SHOWN_MEMBERS = 8


def describe(ranks: tuple[int, ...]) -> str:
    """How messages name a group: its world ranks, or the first few and the count.

    >>> describe((0, 2)), describe(tuple(range(64)))
    ('group [0, 2]', 'group [0, 1, 2, 3, 4, 5, 6, 7, ... 64 ranks]')
    """
    if len(ranks) <= _SHOWN_MEMBERS:
        return f"group {list(ranks)}"
    return f"group [{', '.join(map(str, ranks[:_SHOWN_MEMBERS]))}, ... {len(ranks)} ranks]"


class NonMember:
    """What ``new_group`` (and ``split`` with ``color=None``) return on the ranks left out: falsy,
    with the group's ``ranks``; ``rank()`` is -1, and any collective on it (any of the table's:
    ``collectives.calls.table``) raises CollectiveUsageError on this rank.

    >>> g = NonMember((0, 1), 3)
    >>> bool(g), g.rank(), g.ranks
    (False, -1, (0, 1))
    >>> g.gather(np.ones(2))
    Traceback (most recent call last):
    ...
    collectives.errors.CollectiveUsageError: gather: group: rank 3 is not a member of group [0, 1]; ...
    """

    def __init__(self, ranks: tuple[int, ...], world_rank: int):
        self.ranks = tuple(ranks)
        self.world_rank = world_rank

    def __bool__(self) -> bool:
        return False

    def rank(self) -> int:
        return -1

    def size(self) -> int:
        return len(self.ranks)

    def refusal(self, collective: str) -> CollectiveUsageError:
        members = describe(self.ranks) if self.ranks else "a split group (color=None)"
        return CollectiveUsageError(f"{collective}: group: rank {self.world_rank} is not a member of {members}; "
                                    "the group was made without it (check `if group:` before using it)")

    def __getattr__(self, name: str):
        if name in BY_NAME:
            def refuse(*args, **kwargs):
                raise self.refusal(name)
            return refuse
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<NonMember of {describe(self.ranks)}: rank {self.world_rank} is not in it>"
