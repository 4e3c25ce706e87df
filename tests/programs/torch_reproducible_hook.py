"""DDP with ``collectives.torch.reproducible_hook`` on the "ring" backend:
``mpiexec -n N python -m tests.programs.torch_reproducible_hook [--steps 8]``.

A small MLP in several DDP buckets trains on rank-dependent data. Rank 0 prints one line per
check, ``CHECK <what>: ok`` or ``... FAILED <why>``, then ``digest <hex>`` of the final parameters:

* ``replicas``: every rank's parameters are bit for bit the same after every step;
* ``hook``: the hook averaged every bucket of every step (DDP did not fall back to its own; its
  first step may hold fewer buckets, as DDP rebuilds them after it);
* ``trains``: the loss of the last step is below the first's;
* ``avg``: one bucket's result against the exact mean of every rank's bucket (float64 sums of
  float32 values of one sign and small range are exact here), rounded once to float32.

The test runs it under several ``COLLECTIVES_ALGORITHM`` settings and compares the digests;
``--plain`` trains with DDP's own all-reduce instead (no hook, no ``hook`` check): the comparison.
"""
from __future__ import annotations

import argparse
import hashlib

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch
from collectives.torch import reproducible_hook

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def check(what: str, ok: bool, why: str = "") -> None:
    if RANK == 0:
        print(f"CHECK {what}: {'ok' if ok else 'FAILED ' + why}", flush=True)


def exact_mean_check() -> None:
    """One call of the hook's arithmetic on a bucket of positive float32 values whose float64 sum
    is exact (their exponents span less than 29 bits), against that sum / N rounded to float32."""
    rng = np.random.default_rng(RANK)
    mine = (rng.random(4096) + 0.5).astype(np.float32)
    every = COMM.allgather(mine)
    exact = (np.sum(np.array(every, np.float64), axis=0) / N).astype(np.float32)
    tensor = torch.from_numpy(mine.copy())

    class Bucket:   # (the one method of dist.GradBucket the hook asks for)
        def buffer(self):
            return tensor

    result = reproducible_hook(None, Bucket()).wait()
    check("avg", bool(np.array_equal(result.numpy(), exact)), f"{int((result.numpy() != exact).sum())} differ")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--plain", action="store_true", help="DDP's own all-reduce, no hook (the comparison)")
    args = parser.parse_args()
    dist.init_process_group("ring")
    torch.manual_seed(RANK + 1)   # DDP broadcasts rank 0's
    module = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                 torch.nn.Tanh(), torch.nn.Linear(256, 4))
    ddp = DDP(module, bucket_cap_mb=0.1)
    DDP(torch.nn.Linear(2, 2)).register_comm_hook(None, reproducible_hook)   # (as documented: DDP reads its annotations)
    calls = []

    def counted(state, bucket):   # (no annotations: DDP compares them with its types)
        calls.append(bucket.index())
        return reproducible_hook(state, bucket)

    if not args.plain:
        ddp.register_comm_hook(None, counted)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + RANK)
    x, target = torch.randn(32, 20, generator=data), torch.randn(32, 4, generator=data)
    losses, same = [], True
    for _ in range(args.steps):
        loss = (ddp(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy()
        same &= all(np.array_equal(flat, other) for other in COMM.allgather(flat))
    buckets = len(set(calls))
    check("replicas", same)
    if not args.plain:   # (DDP's first step may hold its buckets otherwise than the later ones)
        check("hook", buckets >= 2 and len(calls) >= (buckets - 1) * (args.steps - 1) + args.steps,
              f"{len(calls)} calls, {buckets} buckets")
    total = COMM.allreduce(sum(losses[-1:]) - losses[0])
    check("trains", total < 0, f"losses {losses}")
    exact_mean_check()
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy()
    if RANK == 0:
        print(f"digest {hashlib.blake2b(flat.tobytes(), digest_size=8).hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
