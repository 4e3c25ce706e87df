"""A DDP script as torch users write it, for any backend: ``torchrun --nproc-per-node N
tests/programs/torchrun_ddp.py BACKEND [FILE]``. Each rank prints one line: an integer all-reduce
(exact) and a digest of the parameters after 5 steps, which tests compare between ring and gloo;
with FILE, rank 0 also saves the parameters there (numpy's .npy: floats summed in another order
differ in their last bits at 3 ranks)."""
import hashlib
import sys

import numpy as np

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

backend = sys.argv[1]
if backend == "ring":
    import collectives.torch  # noqa: F401  (registers "ring")
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
for _ in range(5):
    loss = model(torch.randint(-4, 4, (4, 8), generator=data).float()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
ints = torch.arange(6, dtype=torch.int64) * (rank + 1)
dist.all_reduce(ints)
digest = hashlib.blake2b(b"".join(p.detach().numpy().tobytes() for p in model.parameters()), digest_size=8)
print(f"rank {rank} of {size}: ints {ints.tolist()} parameters {digest.hexdigest()}", flush=True)
if rank == 0 and len(sys.argv) > 2:
    np.save(sys.argv[2], np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]))
if backend == "ring":   # (gloo of this torch crashes in its teardown at times: "terminate called ...")
    dist.destroy_process_group()
