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
    local_ranks = int(os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or 1)
    if local_ranks > 1:
        threads = str(max(1, (os.cpu_count() or 1) // local_ranks))
        for variable in THREAD_VARIABLES:
            os.environ.setdefault(variable, threads)
