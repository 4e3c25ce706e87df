"""DDP on the "ring" backend as a user runs it: ``mpiexec -n N python -m tests.programs.torch_ddp SCENARIO``.

plain:   init_process_group("ring") and nothing more; trains, prints each rank's loss and a digest
         of its parameters.
differs: one rank's model has a wider layer; every rank prints the error it meets.
dies:    rank 1 dies (os._exit) at step 3; every other rank prints the error it meets and how long
         its failing call took.
"""
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401 - registers "ring"


def model(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(dist.get_rank())   # different on every rank: DDP's broadcast makes them one
    return torch.nn.Sequential(torch.nn.Linear(20, width), torch.nn.Tanh(), torch.nn.Linear(width, 4))


def main(scenario: str) -> None:
    assert "MASTER_ADDR" not in os.environ
    dist.init_process_group("ring")
    rank, n = dist.get_rank(), dist.get_world_size()
    try:
        ddp = DDP(model(33 if scenario == "differs" and rank == n - 1 else 32))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(rank)
        for step in range(8):
            if scenario == "dies" and rank == 1 and step == 3:
                os._exit(1)
            started = time.monotonic()
            loss = ddp(torch.randn(16, 20, generator=data)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"rank {rank}: step {step} loss {loss.item():.6f}", flush=True)
    except Exception as error:   # noqa: BLE001 - the report is the point
        print(f"rank {rank}: {type(error).__name__} after {time.monotonic() - started if 'started' in dir() else 0:.2f} s:"
              f" {error}", flush=True)
        sys.exit(1)
    params = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy().tobytes()
    print(f"rank {rank}: params {hashlib.sha256(params).hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
