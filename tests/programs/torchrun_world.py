"""The numpy door under a launcher of torch's: ``col.init()`` forms the MPI world; mpi4py's
COMM_WORLD is then that world. Each rank prints ``rank R of N (COMM_WORLD M): right`` (an
all-reduce of rank-dependent values equal to mpi4py's own), or its error in one line."""
import sys

import numpy as np

import collectives as col

try:
    col.init()
except (col.CollectiveError, col.CollectiveUsageError) as error:
    print(f"error: {error}", flush=True)
    sys.exit(2)
from mpi4py import MPI  # noqa: E402  (after the runtime: it formed the world first)

x = (np.arange(1000) % 7 + col.rank()).astype(np.float64)
ours, theirs = col.allreduce(x), np.empty_like(x)
MPI.COMM_WORLD.Allreduce(x, theirs)
right = "right" if np.array_equal(ours, theirs) else "WRONG"
print(f"rank {col.rank()} of {col.size()} (COMM_WORLD {MPI.COMM_WORLD.Get_size()}): {right}", flush=True)
