"""What ``dist.scatter`` costs on ring and on gloo, for a list of separate tensors and for one that
lies end to end in one memory (``list(big.chunk(n))``), which ring sends without stacking it.

    mpiexec -n 2 python scripts/torch_scatter_cost.py [--mib 1,64] [--repeats 7]

Each backend is timed in its own pass (the other idle); medians of ``--repeats`` calls at the
root, after a barrier each; every result is checked against the root's tensor.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import collectives.torch  # noqa: F401 - registers the "ring" backend


def median_ms(group, pieces, out: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        began = time.perf_counter()
        dist.scatter(out, pieces, src=0, group=group)
        times.append(time.perf_counter() - began)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="1,64", help="MiB each rank receives, comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rank, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    port = MPI.COMM_WORLD.bcast(29500 + os.getpid() % 1000 if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    groups = {"ring": dist.new_group(backend="ring"), "gloo": dist.group.WORLD}
    if rank == 0:
        print(f"{'MiB/rank':>8} {'list':>9} {'ring ms':>9} {'gloo ms':>9}")
    for mib in map(float, args.mib.split(",")):
        elems = int(mib * 2**20) // 4
        big = torch.arange(elems * n, dtype=torch.float32)
        out = torch.empty(elems)
        for kind in ("chunks", "separate"):
            pieces = None if rank else list(big.chunk(n)) if kind == "chunks" else [c.clone() for c in big.chunk(n)]
            times = {}
            for name, group in groups.items():
                times[name] = median_ms(group, pieces, out, args.repeats)
                assert torch.equal(out, big[rank * elems:(rank + 1) * elems]), f"{name} scattered wrong data"
            if rank == 0:
                print(f"{mib:>8g} {kind:>9} {times['ring']:>9.2f} {times['gloo']:>9.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
