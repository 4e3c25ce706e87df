"""The launchers' facts that a program needs before numpy loads: whether srun started this process,
and how many ranks the launcher started on this host. Pure reads of an environment (a mapping),
standard library only: ``cmdline.cores`` loads this file by its path to share the cores before
numpy's BLAS starts its threads (``import collectives`` loads numpy). ``launchers`` reads every
other fact and is where the runtime asks for these too.

======================================  ===========================================================
started by                              ranks on this host
======================================  ===========================================================
MPICH's mpiexec (also inside salloc)    ``MPI_LOCALNRANKS``
Open MPI's mpirun (also inside salloc)  ``OMPI_COMM_WORLD_LOCAL_SIZE``
torchrun (also one started by srun)     ``LOCAL_WORLD_SIZE``
srun, directly (``--mpi=pmi2|pmix``)    ``SLURM_STEP_TASKS_PER_NODE`` at this node, ``SLURM_NODEID``
none of them                            1
======================================  ===========================================================

>>> ranks_on_this_host({"SLURM_STEP_NUM_TASKS": "8", "SLURM_MPI_TYPE": "pmi2", "PMI_FD": "5", "PMI_SIZE": "8",
...                     "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"})     # srun --mpi=pmi2
4
"""
from __future__ import annotations

import os
from typing import Mapping


def srun_directly(environment: Mapping[str, str] = os.environ) -> bool:
    """Whether srun started this process itself (not an mpiexec's proxy that srun started).

    >>> srun_directly({"SLURM_STEP_NUM_TASKS": "4"})
    True
    >>> srun_directly({"SLURM_STEP_NUM_TASKS": "1", "MPI_LOCALNRANKS": "2"})   # an mpiexec's proxy that srun started
    False
    """
    return ("SLURM_STEP_NUM_TASKS" in environment and "MPI_LOCALNRANKS" not in environment
            and "OMPI_COMM_WORLD_SIZE" not in environment)


def ranks_on_this_host(environment: Mapping[str, str] = os.environ) -> int:
    """How many ranks the launcher started on this host (the table above; 1 where none says).

    >>> ranks_on_this_host({"MPI_LOCALNRANKS": "3", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"})
    3
    >>> ranks_on_this_host({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}), ranks_on_this_host({"LOCAL_WORLD_SIZE": "8"})
    (2, 8)
    >>> ranks_on_this_host({}), ranks_on_this_host({"MPI_LOCALNRANKS": "many"})
    (1, 1)
    """
    # The launcher that started this process first: an mpiexec or a torchrun inside srun's step is the one.
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        count = _count(environment.get(name))
        if count:
            return count
    return srun_tasks_on_this_node(environment) if srun_directly(environment) else 1


def srun_tasks_on_this_node(environment: Mapping[str, str]) -> int:
    """How many tasks of this step srun started on this node (1 where it says nothing readable):
    ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of the first three nodes, 1 on the
    fourth) at this node's index in the step, ``SLURM_NODEID``.

    >>> srun_tasks_on_this_node({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"})
    1
    >>> srun_tasks_on_this_node({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"})
    2
    >>> srun_tasks_on_this_node({})
    1
    """
    try:
        counts = []
        for part in environment["SLURM_STEP_TASKS_PER_NODE"].split(","):
            count, _, times = part.partition("(x")
            counts += [int(count)] * (int(times.rstrip(")")) if times else 1)
        return counts[int(environment["SLURM_NODEID"])]
    except (KeyError, ValueError, IndexError):
        return 1


def _count(value: str | None) -> int:
    """A launcher's count, 0 where it is not a positive integer."""
    return int(value) if value and value.isdigit() and int(value) > 0 else 0
