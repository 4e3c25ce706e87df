"""A cupy all-reduce whose shape differs on the last rank, as a user's program:
``mpiexec -n N python -m tests.programs.gpu_mismatch``.

Every rank must raise the runtime's error naming the difference (before anything is queued on the
GPU), not wait inside NCCL; then, still in step, a correct call must work. Each rank prints what it
met and exits 0 only if it saw the error and the next call's right result.
"""
import sys

import cupy
import numpy as np

import collectives as col


def main() -> int:
    col.use_local_gpu()
    col.init(timeout=20)
    rank, n = col.rank(), col.size()
    if n < 2:
        print("gpu_mismatch needs 2 or more ranks", file=sys.stderr)
        return 2
    count = 1001 if rank == n - 1 else 1000
    try:
        col.allreduce(cupy.full(count, rank + 1, cupy.float32))
        print(f"rank {rank}: no error for a shape that differs across ranks", flush=True)
        return 1
    except (col.CollectiveUsageError, col.CollectiveError) as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
    total = col.allreduce(cupy.full(1000, rank + 1, cupy.float32))
    right = np.array_equal(cupy.asnumpy(total), np.full(1000, n * (n + 1) / 2, np.float32))
    print(f"rank {rank}: the next all-reduce {'is right' if right else 'is WRONG'}", flush=True)
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
