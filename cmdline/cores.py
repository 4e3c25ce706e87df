"""Each rank's share of the host's cores for BLAS: imports nothing but ``os``, so that a program
can call it before numpy is imported (numpy's BLAS reads these variables when it loads)."""
from __future__ import annotations

import os

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores_between_local_ranks() -> None:
    """Give each rank its share of the cores for BLAS, unless the user chose (as torchrun does).

    Several ranks each starting one BLAS thread per core oversubscribe the machine and
    make every step wait for the slowest rank. Must run before numpy is imported.
    """
    local_ranks = int(os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
                      or srun_tasks_on_this_node(os.environ))
    if local_ranks > 1:
        threads = str(max(1, (os.cpu_count() or 1) // local_ranks))
        for variable in THREAD_VARIABLES:
            os.environ.setdefault(variable, threads)


def srun_tasks_on_this_node(environment) -> int:
    """How many tasks of this step srun started on this node (1 when srun did not start it, or
    says nothing readable): ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of the first
    three nodes, 1 on the fourth) at this node's index in the step, ``SLURM_NODEID``.

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
