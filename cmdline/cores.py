"""Each rank's share of the host's cores for BLAS, set before numpy is imported (numpy's BLAS reads
these variables when it loads). So this module imports nothing that loads numpy: the launchers'
count of ranks on this host comes from ``collectives/process/launch_environment.py``, loaded by its
path (importing it through ``collectives`` would load numpy first)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores_between_local_ranks() -> None:
    """Give each rank its share of the cores for BLAS, unless any of THREAD_VARIABLES is set: the user
    chose (as torchrun does, with OMP_NUM_THREADS=1).

    Several ranks each starting one BLAS thread per core oversubscribe the machine and
    make every step wait for the slowest rank. Must run before numpy is imported.
    """
    if any(variable in os.environ for variable in THREAD_VARIABLES):   # (the user's, or torchrun's
        return   # OMP_NUM_THREADS=1: OpenBLAS reads its own variable first, so setting it would overrule theirs)
    local_ranks = launch_environment().ranks_on_this_host(os.environ)
    if local_ranks > 1:
        threads = str(max(1, (os.cpu_count() or 1) // local_ranks))
        for variable in THREAD_VARIABLES:
            os.environ[variable] = threads


def usable_cpus(comm: Any) -> int:
    """The cpus the ranks of one host may run on together (the union of their affinities: a rank bound
    to a core of its own shares it with none), the fewest over the hosts of MPI communicator ``comm``.
    Collective: every rank of ``comm`` calls it.

    >>> from mpi4py import MPI
    >>> usable_cpus(MPI.COMM_SELF) == len(os.sched_getaffinity(0))
    True
    """
    from mpi4py import MPI   # (here: this module loads before MPI may be, see the module's note)
    cpus: dict[str, set[int]] = {}
    for host, mine in comm.allgather((MPI.Get_processor_name(), os.sched_getaffinity(0))):
        cpus.setdefault(host, set()).update(mine)
    return min(len(c) for c in cpus.values())


def launch_environment() -> ModuleType:
    """``collectives/process/launch_environment.py`` (standard library only), loaded on its own: not
    through its package, whose ``__init__`` loads numpy.

    >>> launch_environment().ranks_on_this_host({"MPI_LOCALNRANKS": "4"})
    4
    """
    path = Path(__file__).resolve().parent.parent / "collectives" / "process" / "launch_environment.py"
    spec = importlib.util.spec_from_file_location("_launch_environment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
