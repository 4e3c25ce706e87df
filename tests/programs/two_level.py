"""All-reduce over declared hosts, as a user's program:
``COLLECTIVES_HOSTS=H mpiexec -n N python -m tests.programs.two_level OUT.npz``.

Each rank checks its results against MPI's own Allreduce and that every rank holds the same
bytes; rank 0 says which path the world takes and saves its results to OUT.npz."""
import hashlib
import sys

import numpy as np
from mpi4py import MPI

import collectives as col
from collectives.process.startup import world


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(path: str) -> None:
    rank, n = col.rank(), col.size()
    rng = np.random.default_rng(rank)
    cases = {"float32_sum": (rng.standard_normal(300_001).astype(np.float32), "sum"),
             "float64_avg": (rng.standard_normal(100_003), "avg"),
             "int64_sum": (np.arange(70_001, dtype=np.int64) * (rank + 1), "sum"),
             "float32_max": (rng.standard_normal(50_000).astype(np.float32), "max")}
    results = {}
    for name, (x, op) in cases.items():
        ours = col.allreduce(x, op=op)
        expected = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, expected, op=MPI.MAX if op == "max" else MPI.SUM)
        if op == "avg":
            expected /= n
        close = np.allclose(ours, expected, rtol=1e-4, atol=1e-4)
        identical = len(set(MPI.COMM_WORLD.allgather(hashlib.blake2b(ours.tobytes()).hexdigest()))) == 1
        _say(f"rank {rank}: {name}: {'close to MPI' if close else 'FAR FROM MPI'}, "
             f"{'identical on every rank' if identical else 'DIFFERS BETWEEN RANKS'}")
        results[name] = ours
    group = col.new_group(list(reversed(range(n))))   # every rank, in reverse: the hosts' blocks reversed too
    x = cases["float64_avg"][0]
    expected = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, expected)
    ours = group.allreduce(x)
    identical = len(set(MPI.COMM_WORLD.allgather(hashlib.blake2b(ours.tobytes()).hexdigest()))) == 1
    _say(f"rank {rank}: reversed group: {'close to MPI' if np.allclose(ours, expected) else 'FAR FROM MPI'}, "
         f"{'identical on every rank' if identical else 'DIFFERS BETWEEN RANKS'}, "
         f"{'two levels' if group.levels is not None else 'the flat ring'}")
    levels = world().levels
    if rank == 0:
        _say("rank 0: " + ("the flat ring" if levels is None else
                           f"two levels: {levels[0].size} ranks per host, {levels[1].size} hosts"))
        np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])
