"""Every collective on cupy arrays against the same collective on numpy arrays (MPI path), as a
user's program: ``mpiexec -n N python -m tests.programs.gpu_collectives``. Prints one line per rank
and exits 1 on any difference. Run by tests/test_gpu.py on a machine with a GPU.

GPU arrays run the ring only; the host calls are forced onto the ring too (``algorithm="ring"``), so
both add in the same order and must agree bit for bit. (With the host's own choice, recursive
doubling for small arrays, float16 "avg" at 3 ranks differed in the last place: its pre-scaled
shares are not integers, so the order of additions shows.)"""
import sys

import cupy
import numpy as np

import collectives as col
from collectives.process.startup import world

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint64"]
OPS = ["sum", "avg", "min", "max", "prod"]


def rank_input(count: int, dtype: str, op: str) -> np.ndarray:
    i = np.arange(count)
    values = (i * 7 + col.rank() * 13) % 11 + 1 if op != "prod" else (i + col.rank()) % 3 + 1
    return values.astype(dtype)


def main() -> int:
    try:
        col.use_local_gpu()
    except col.CollectiveError as e:   # (one line per rank: two tracebacks on one terminal interleave)
        print(f"rank {col.rank()}: CollectiveError: {e}", flush=True)
        return 1
    n, problems, checked = col.size(), [], 0
    # 1 MiB of float32 with 64 KiB segments: several segments per chunk, so the pipelined path runs
    col.init(segment_bytes=64 << 10)
    for count in [0, 1, n + 1, 1001, 1 << 18]:
        for dtype in DTYPES:
            for op in OPS:
                if op == "avg" and dtype[0] in "iu":
                    continue
                host = rank_input(count, dtype, op)
                device = cupy.asarray(host)
                pairs = [(col.allreduce(device, op), col.allreduce(host, op, algorithm="ring")),
                         (col.reduce_scatter(device, op), col.reduce_scatter(host, op, algorithm="ring"))]
                in_place = device.copy()
                col.allreduce(in_place, op, out=in_place)
                pairs.append((in_place, pairs[0][1]))
                for got, expected in pairs:
                    checked += 1
                    if not np.array_equal(cupy.asnumpy(got), expected):
                        problems.append(f"{op} {dtype} x{count}")
            gathered = col.allgather(cupy.asarray(rank_input(count + col.rank(), dtype, "sum")))
            checked += 1
            if not np.array_equal(cupy.asnumpy(gathered), col.allgather(rank_input(count + col.rank(), dtype, "sum"))):
                problems.append(f"allgather {dtype} x{count}")
            root = (count + 1) % n
            buffer = cupy.asarray(rank_input(count, dtype, "sum"))
            col.broadcast(buffer, root=root)
            checked += 1
            if not np.array_equal(cupy.asnumpy(buffer), col.broadcast(rank_input(count, dtype, "sum"), root=root)):
                problems.append(f"broadcast {dtype} x{count}")
    cupy.cuda.get_current_stream().synchronize()
    transport = type(world().device_transport).__name__
    print(f"rank {col.rank()}: {checked} checks over {transport}, {len(problems)} wrong: {problems[:5]}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
