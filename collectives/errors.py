"""The two errors a caller of ``collectives`` can see."""


class CollectiveUsageError(ValueError):
    """A call was wrong (bad argument); raised before anything is sent, buffers untouched.

    The message names the collective and the argument: ``allreduce: op: unknown reduction 'mean' ...``.
    """


class CollectiveError(RuntimeError):
    """The transport failed during a collective (a peer died, a message was lost)."""
