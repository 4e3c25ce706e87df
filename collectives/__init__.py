"""Ring collectives for data-parallel training.

>>> import numpy as np, collectives as col          # run under mpiexec -n N
>>> grads = np.ones(4, np.float32) * col.rank()
>>> col.allreduce(grads, op="avg", out=grads)       # doctest: +SKIP
>>> work = col.allreduce(grads, out=grads, async_op=True)   # doctest: +SKIP
>>> work.wait()                                     # doctest: +SKIP
>>> rows = col.split(col.rank() // 2)               # groups: collectives on subsets  # doctest: +SKIP
>>> rows.allreduce(grads)                           # doctest: +SKIP

See ``collectives.api`` for each call, ``collectives.group`` for groups and ``collectives.world``
for the settings.
"""
from collectives import timeline
from collectives.api import (allgather, allreduce, allreduce_many, barrier, broadcast, destroy, new_group,
                             reduce_scatter, split, use_local_gpu)
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.group import Group, NonMember
from collectives.p2p import Request, irecv, isend, recv, send, wait_all
from collectives.progress import Work
from collectives.world import abort, init, local_rank, local_size, rank, size

__all__ = ["init", "abort", "rank", "size", "local_rank", "local_size", "use_local_gpu", "allreduce", "allreduce_many",
           "reduce_scatter", "allgather", "broadcast", "barrier", "new_group", "split", "destroy", "Group", "NonMember",
           "send", "recv", "isend", "irecv", "wait_all", "Request",
           "Work", "timeline",
           "CollectiveError", "CollectiveUsageError"]
