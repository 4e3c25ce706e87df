"""CUDA tensors through the "ring" backend as a user's program: ``mpiexec -n N python -m tests.programs.torch_cuda``.

Each collective DDP and common code calls, on CUDA tensors with rank-dependent integer-valued inputs,
against the result computed on the host; then DDP trains a small model on the GPU for a few steps and
every rank's parameters must be the same bits. Prints one line per rank and exits 1 on any difference.
"""
import hashlib
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives as col
import collectives.torch  # noqa: F401 - registers "ring"


def rank_tensor(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(count) * 7 + rank * 13) % 11 + 1).to(dtype)


def main() -> int:
    dist.init_process_group("ring")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(col.local_rank() % torch.cuda.device_count())
    cuda, problems, checked = torch.device("cuda"), [], 0

    def check(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
        nonlocal checked
        checked += 1
        if got.device.type != "cuda" or not torch.equal(got.cpu(), expected):
            problems.append(name)

    rows = {dtype: [rank_tensor(r, 1000, dtype) for r in range(n)]
            for dtype in (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64)}
    for dtype, inputs in rows.items():
        for op, reduce in [(dist.ReduceOp.SUM, lambda s: torch.stack(s).sum(0)),
                           (dist.ReduceOp.MAX, lambda s: torch.stack(s).amax(0)),
                           (dist.ReduceOp.MIN, lambda s: torch.stack(s).amin(0))]:
            t = inputs[rank].to(cuda)
            dist.all_reduce(t, op)
            check(f"all_reduce {op} {dtype}", t, reduce(inputs).to(dtype))
        t = inputs[rank].to(cuda)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        check(f"all_reduce async {dtype}", t, torch.stack(inputs).sum(0).to(dtype))
        gathered = torch.empty(n * 1000, dtype=dtype, device=cuda)
        dist.all_gather_into_tensor(gathered, inputs[rank].to(cuda))
        check(f"all_gather_into_tensor {dtype}", gathered, torch.cat(inputs))
        listed = [torch.empty(1000, dtype=dtype, device=cuda) for _ in range(n)]
        dist.all_gather(listed, inputs[rank].to(cuda))
        check(f"all_gather {dtype}", torch.cat(listed), torch.cat(inputs))
        t = inputs[rank].to(cuda)
        dist.broadcast(t, src=n - 1)
        check(f"broadcast {dtype}", t, inputs[n - 1])
        block = torch.empty(1000 // n if 1000 % n == 0 else 0, dtype=dtype, device=cuda)
        if block.numel():
            dist.reduce_scatter_tensor(block, inputs[rank].to(cuda))
            check(f"reduce_scatter_tensor {dtype}", block, torch.stack(inputs).sum(0).to(dtype).chunk(n)[rank])
    sizes = [1 + (j * 3) % 5 for j in range(n)]   # (uneven from 2 ranks: rank j's output has tensor j's size)
    mine = torch.empty(sizes[rank], device=cuda)
    dist.reduce_scatter(mine, [rank_tensor(rank, sizes[j], torch.float32).to(cuda) + j for j in range(n)])
    check("reduce_scatter of an uneven list", mine,
          sum(rank_tensor(r, sizes[rank], torch.float32) + rank for r in range(n)))
    whole = torch.arange(n * 6, dtype=torch.float32, device=cuda)
    for kind, listed in [("end to end", list(whole.chunk(n))), ("separate", [c.clone() for c in whole.chunk(n)])]:
        out = torch.empty(6, device=cuda)
        dist.scatter(out, listed if rank == 0 else None, src=0)
        check(f"scatter of a list {kind}", out, whole.cpu().chunk(n)[rank])
    t = rows[torch.float32][rank].to(cuda)
    dist.all_reduce(t, dist.ReduceOp.AVG)
    check("all_reduce AVG float32", t, torch.stack(rows[torch.float32]).sum(0) / n)

    torch.manual_seed(rank)   # replicas start apart: DDP's broadcast makes them one
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).to(cuda))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator(device=cuda).manual_seed(100 + rank)
    for _ in range(5):
        loss = model(torch.randn(16, 20, device=cuda, generator=data)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy().tobytes()
    digest = torch.tensor(list(hashlib.sha256(params).digest()[:8]), dtype=torch.int64, device=cuda)
    digests = torch.empty(n * 8, dtype=torch.int64, device=cuda)
    dist.all_gather_into_tensor(digests, digest)
    check("DDP replicas identical", digests, digest.cpu().repeat(n))
    torch.cuda.synchronize()
    print(f"rank {rank}: {checked} torch CUDA checks over {col.gpu_transport()}, {len(problems)} wrong: "
          f"{problems[:5]}; loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
