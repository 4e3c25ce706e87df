"""Faults through torch.distributed on the "ring" backend, as users meet them:
``mpiexec -n N python -m tests.programs.torch_faults SCENARIO``.

Every rank prints one line: ``rank R: ok <result>`` or ``rank R: <ErrorType> after <s> s: <message>``,
and exits 1 on an error. Rank 1 is the odd one out where a scenario needs one.

refusals (every rank must raise the same error; ``refusals`` runs them all in one world):
  count_differs        all_reduce of 3 + rank elements
  gather_uneven        all_gather of 2 + rank elements into lists of their own sizes
  scatter_short        scatter into an output one element shorter on rank 1
  reduce_scatter_list  reduce_scatter whose input list on rank 1 only has a longer tensor (uneven lists
                       must be alike on every rank)
  splits_wrong         all_to_all_single whose output_split_sizes disagree with what is sent
  gather_list_wrong    gather whose gather_list on the root has a tensor of the wrong size
  sparse_max           all_reduce (MAX) of a sparse tensor: gloo, and ring, reduce those by SUM only
accepted as gloo accepts them (``accepted`` runs both in one world, each line ``rank R: NAME: ok <result>``):
  bool                 all_reduce (SUM, MIN) of rank == 0: [True] and [False] everywhere
  noncontiguous        all_reduce of a transposed tensor on rank 1 only
peers that fail (every survivor must raise naming rank 1):
  exits, killed, late  rank 1 calls sys.exit / is SIGKILLed / comes only once every other rank's call
                       has timed out (each cues it after its error), then all_reduce
  barrier_late         rank 1 reaches a barrier after the others' barriers timed out
  ddp_exits, ddp_killed, ddp_raises, ddp_late, ddp_uneven
                       the same inside DDP training (uneven: rank 1 has fewer batches, no Join)
"""
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401 - registers "ring"
from tests.programs.cues import await_cues, cue

TIMEOUT_S = float(os.environ.get("COLLECTIVES_TIMEOUT", "4"))
LATE = ("late", "barrier_late", "ddp_late")   # rank 1 comes after the others' calls timed out


def refusal(name: str, rank: int, n: int):
    if name == "count_differs":
        t = torch.ones(3 + rank)
        dist.all_reduce(t)
        return t
    if name == "gather_uneven":
        outs = [torch.zeros(2 + rank) for _ in range(n)]
        dist.all_gather(outs, torch.full((2 + rank,), float(rank)))
        return outs
    if name == "scatter_short":
        out = torch.zeros(3 - (rank == 1))
        dist.scatter(out, [torch.full((3,), float(r)) for r in range(n)] if rank == 0 else None, src=0)
        return out
    if name == "reduce_scatter_list":
        out = torch.zeros(2)
        dist.reduce_scatter(out, [torch.ones(2 + (rank == 1 and r == 0)) for r in range(n)])
        return out
    if name == "splits_wrong":
        out = torch.zeros(2 * n)
        dist.all_to_all_single(out, torch.arange(2.0 * n), output_split_sizes=[1] * (n - 1) + [n + 1],
                               input_split_sizes=[2] * n)
        return out
    if name == "gather_list_wrong":
        outs = [torch.zeros(2 + (r == 1)) for r in range(n)] if rank == 0 else None
        dist.gather(torch.ones(2), outs, dst=0)
        return outs
    if name == "sparse_max":
        t = torch.eye(3).to_sparse()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t
    if name == "bool":
        a, b = torch.tensor([rank == 0]), torch.tensor([rank == 0])
        dist.all_reduce(a)
        dist.all_reduce(b, op=dist.ReduceOp.MIN)
        return [a.tolist(), b.tolist()]
    if name == "noncontiguous":
        t = torch.arange(6.0).reshape(2, 3) * (rank + 1)
        t = t.t() if rank == 1 else t.t().contiguous()
        dist.all_reduce(t)
        return t.tolist()
    return None


def peer(name: str, rank: int, n: int):
    if rank == 1 and name in ("exits", "ddp_exits"):
        sys.exit(3)
    if rank == 1 and name in ("killed", "ddp_killed"):
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and name in LATE:
        await_cues(r for r in range(n) if r != 1)
    if name == "barrier_late":
        dist.barrier()
        return "passed"
    t = torch.full((4,), float(rank))
    for _ in range(3):
        dist.all_reduce(t)
    return t.tolist()


def ddp(name: str, rank: int, n: int):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 3 if name == "ddp_uneven" and rank == 1 else 6
    for step in range(steps):
        if rank == 1 and step == 3:
            if name == "ddp_raises":
                raise ValueError("rank 1's own bug at step 3")
            peer(name, rank, n)
        loss = model(torch.randn(16, 20)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return f"{steps} steps"


REFUSALS = ("count_differs", "gather_uneven", "scatter_short", "reduce_scatter_list", "splits_wrong",
            "gather_list_wrong", "sparse_max")


def refusals(rank: int, n: int) -> None:
    """Every refusal in turn in one world, each line ``rank R: NAME: <ErrorType> after <s> s: <message>``
    (a refusal is raised alike on every rank, so the world goes on), then an all_reduce that must
    still be right: ``rank R: ok after the refusals <result>``."""
    for name in REFUSALS:
        started = time.monotonic()
        try:
            refusal(name, rank, n)
            print(f"rank {rank}: {name}: no error", flush=True)
        except Exception as error:   # noqa: BLE001 - the report is the point
            text = " ".join(str(error).split())
            print(f"rank {rank}: {name}: {type(error).__name__} after {time.monotonic() - started:.2f} s: {text}",
                  flush=True)
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    print(f"rank {rank}: ok after the refusals {t.tolist()}", flush=True)


def main(name: str) -> None:
    dist.init_process_group("ring", timeout=timedelta(seconds=TIMEOUT_S))
    rank, n = dist.get_rank(), dist.get_world_size()
    if name == "refusals":
        refusals(rank, n)
        dist.destroy_process_group()
        return
    if name == "accepted":
        for each in ("bool", "noncontiguous"):
            print(f"rank {rank}: {each}: ok {refusal(each, rank, n)}", flush=True)
        dist.destroy_process_group()
        return
    scenario = ddp if name.startswith("ddp_") else peer if name in ("exits", "killed", "late", "barrier_late") \
        else refusal
    started = time.monotonic()
    try:
        result = scenario(name, rank, n)
    except Exception as error:   # noqa: BLE001 - the report is the point
        text = " ".join(str(error).split())
        print(f"rank {rank}: {type(error).__name__} after {time.monotonic() - started:.2f} s: {text}", flush=True)
        if name in LATE and rank != 1:
            cue(1)
        sys.exit(1)
    print(f"rank {rank}: ok {result}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
