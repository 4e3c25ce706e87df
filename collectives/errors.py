"""The two errors a caller of ``collectives`` can see."""


class CollectiveUsageError(ValueError):
    """A call was wrong (bad argument); raised before anything is sent, buffers untouched.

    The message names the collective and the argument: ``allreduce: op: unknown reduction 'mean' ...``.
    """


class CollectiveError(RuntimeError):
    """The transport failed during a collective (a peer died, a message was lost)."""


class MembershipChanged(CollectiveError):
    """The world's ranks changed (a rank died and the survivors made a world of their own, or
    newcomers joined: ``collectives.elastic``) since this group or call was made: it belongs to
    the world before, which takes no more calls. Make the group again on the new world.

    ``before`` and ``after``: the world's sizes on each side of the change.
    """

    def __init__(self, message: str, before: int = 0, after: int = 0):
        super().__init__(message)
        self.before, self.after = before, after
