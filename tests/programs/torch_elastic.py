"""Elastic DDP on the "ring" backend: when a rank dies, the survivors go on from the last commit.

    mpiexec -disable-auto-cleanup -n 4 python -m tests.programs.torch_elastic 60 --kill 3:20

trains 60 steps; rank 3 SIGKILLs itself at step 20; the three survivors roll back to the commit
of step 20, make the process group again on their new world and finish. The reference for that
run, bit for bit, is a restart from the same commit::

    mpiexec -n 4 python -m tests.programs.torch_elastic 20 --save at20.npz   # 4 ranks to step 20
    mpiexec -n 3 python -m tests.programs.torch_elastic 60 --load at20.npz   # 3 ranks from there

Every rank prints ``rank R of N: step S params DIGEST`` at the end (DIGEST: of its parameters'
bytes). Each step trains on a global batch of 12 examples that depends on the step alone, split
among the ranks, so the world's size changes the sharding and never the data.
"""
import collectives as col
col.elastic.supervise()   # first thing: the survivors of a SIGKILL must outlive MPICH's proxy

import argparse
import hashlib
import os
import signal

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401,E402 - registers "ring"

BATCH = 12   # examples per step, all ranks together (divides among 1, 2, 3, 4 ranks)


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s batch: inputs and the targets of a fixed linear map."""
    data = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 8, generator=data)
    y = x @ torch.arange(32.0).reshape(8, 4) / 32 + 0.1 * torch.randn(BATCH, 4, generator=data)
    share = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
    return x[share], y[share]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill", help="RANK:STEP: that rank (of the first world) SIGKILLs itself at that step")
    parser.add_argument("--save", help="write the state to this .npz at the end (rank 0)")
    parser.add_argument("--load", help="start from the state in this .npz")
    args = parser.parse_args()
    victim = tuple(map(int, args.kill.split(":"))) if args.kill else None

    dist.init_process_group("ring")
    first_rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = list(model.parameters())
    # The momentum buffers made now, so that State holds them (SGD makes them at its first step).
    momenta = [opt.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
    tensors = {**{f"param{i}": p for i, p in enumerate(params)}, **{f"momentum{i}": m for i, m in enumerate(momenta)}}
    state = col.elastic.State(**tensors, step=0)   # (held in place: the model's own tensors roll back)
    if args.load:
        state.step = load(tensors, args.load)
        state.commit()
    ddp = [DDP(model)]   # (a list: the change replaces it)

    def rejoin(state: col.elastic.State, change: col.elastic.Change) -> None:
        """After a change: the process group and DDP again, on the new world."""
        dist.destroy_process_group()
        dist.init_process_group("ring")
        ddp[0] = DDP(model)

    def train(state: col.elastic.State) -> None:
        while state.step < args.steps:
            if victim == (first_rank, state.step):
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(state.step, dist.get_rank(), dist.get_world_size())
            loss = torch.nn.functional.mse_loss(ddp[0](x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.step += 1
            state.commit()

    state.on_change(rejoin)
    col.elastic.run(train, state)
    if args.save and dist.get_rank() == 0:
        save(tensors, state.step, args.save)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()[:16]
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: step {state.step} params {digest}", flush=True)
    dist.destroy_process_group()


def save(tensors: dict, step: int, path: str) -> None:
    """The tensors and the step, as an npz (no pickle)."""
    np.savez(path, step=np.array(step), **{name: t.detach().numpy() for name, t in tensors.items()})


def load(tensors: dict, path: str) -> int:
    """The tensors saved by :func:`save`, in place (the model's own parameters); the step."""
    with np.load(path, allow_pickle=False) as saved:
        for name, t in tensors.items():
            t.detach().copy_(torch.from_numpy(saved[name]))
        return int(saved["step"])


if __name__ == "__main__":
    main()
