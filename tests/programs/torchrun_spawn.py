"""``torch.multiprocessing.spawn`` of N processes with ``init_process_group("ring", rank=r,
world_size=N)`` and MASTER_ADDR, MASTER_PORT set (torch's env:// as its tutorials write it):
``python tests/programs/torchrun_spawn.py N PORT``. Each process prints ``rank R of N: ints [...]``."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, size: int) -> None:
    import collectives.torch  # noqa: F401  (registers "ring")
    dist.init_process_group("ring", rank=rank, world_size=size)
    ints = torch.arange(6, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(ints)
    print(f"rank {rank} of {dist.get_world_size()}: ints {ints.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    size = int(sys.argv[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    mp.spawn(work, args=(size,), nprocs=size)
