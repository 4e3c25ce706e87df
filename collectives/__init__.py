"""Ring collectives for data-parallel training.

>>> import numpy as np, collectives as col          # run under mpiexec -n N
>>> grads = np.ones(4, np.float32) * col.rank()
>>> col.allreduce(grads, op="avg", out=grads)       # doctest: +SKIP
>>> work = col.allreduce(grads, out=grads, async_op=True)   # doctest: +SKIP
>>> work.wait()                                     # doctest: +SKIP
>>> rows = col.split(col.rank() // 2)               # groups: collectives on subsets  # doctest: +SKIP
>>> rows.allreduce(grads)                           # doctest: +SKIP

The layers, each importing only those below it (docs/architecture.md draws them): ``api`` and
``p2p`` (these functions) -> ``process/`` (the process and its world: start, config, leaving) ->
``groups/`` (a Group runs collectives; making and membership) -> ``ops/`` (each collective's
body) -> ``calls/`` (the frame: turn, check, progress, errors) -> ``ring`` (schedule and
transports). ``elastic/`` and ``torch/`` sit on the public face; importing the package installs
nothing (but under srun, before MPI starts: it picks MPICH's network module for ``--mpi=pmi2``,
and refuses ``--mpi=pmix`` for MPICH, in ``collectives.process.launchers``).
"""
import sys

from collectives import about, api, elastic
from collectives.calls import table, timeline
from collectives.about import VERSION as __version__
from collectives.api import (block_bounds, gpu_transport, nccl_communicator, round_to_wire, synchronize, to_host,
                             use_local_gpu, world_group)
from collectives.errors import CollectiveError, CollectiveUsageError, MembershipChanged
from collectives.groups.group import Group
from collectives.groups.membership import NonMember
from collectives.p2p import Request, irecv, isend, recv, send, wait_all
from collectives.calls.progress import Work
from collectives.calls.sizes import format_size, parse_size
from collectives.process import launchers
from collectives.calls.config import Settings
from collectives.process.startup import abort, init, local_rank, local_size, rank, settings, size

# The collectives, one per entry of the table (collectives.calls.table): col.allreduce, col.gather, ...
globals().update({name: getattr(api, name) for name in table.NAMES})

__all__ = ["init", "abort", "rank", "size", "local_rank", "local_size", "settings", "Settings", "use_local_gpu", "gpu_transport", "nccl_communicator",
           *table.NAMES, "table", "world_group", "Group", "NonMember", "block_bounds",
           "send", "recv", "isend", "irecv", "wait_all", "Request",
           "Work", "timeline", "about", "round_to_wire", "to_host", "synchronize", "parse_size", "format_size",
           "CollectiveError", "CollectiveUsageError", "MembershipChanged", "elastic"]

# (at import: a program's own ``from mpi4py import MPI`` may come next)
if "mpi4py.MPI" not in sys.modules:
    launchers.refuse_pmix_for_mpich()
    launchers.choose_network()
