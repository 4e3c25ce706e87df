"""DDP step time, "ring" against torch's gloo, side by side in one job:
``mpiexec -n 2 python scripts/ddp_step.py [--params-millions 34] [--steps 10] [--runs 3]``.

Both process groups span every rank (gloo over loopback, the runtime over MPI); each run times
``--steps`` steps (forward, backward with DDP's bucketed all-reduce, SGD step) of one MLP on each
backend in turn, after two warm-up steps, and rank 0 prints the median step of each run and the
median of the runs' medians.
"""
import argparse
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401 - registers "ring"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_times(group, width: int, layers: int, steps: int) -> list[float]:
    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    model = DDP(torch.nn.Sequential(*blocks), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, width)
    times = []
    for step in range(steps + 2):
        started = time.perf_counter()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-millions", type=float, default=34)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    port = comm.bcast(free_port() if comm.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=timedelta(seconds=300))
    ring, gloo = dist.new_group(backend="ring"), dist.group.WORLD
    width, layers = 2048, max(1, round(args.params_millions * 1e6 / (2048 * 2049)))
    medians = {"ring": [], "gloo": []}
    for _ in range(args.runs):
        for name, group in (("ring", ring), ("gloo", gloo)):
            medians[name].append(statistics.median(step_times(group, width, layers, args.steps)))
    if comm.rank == 0:
        print(f"DDP step, {layers} x Linear({width}, {width}) = {layers * width * (width + 1) / 1e6:.1f} M parameters, "
              f"{comm.size} ranks, batch 32 per rank, medians of {args.steps} steps per run:")
        for name, values in medians.items():
            print(f"  {name}: runs {', '.join(f'{v * 1e3:.1f}' for v in values)} ms; median "
                  f"{statistics.median(values) * 1e3:.1f} ms")
        print(f"  ring / gloo: {statistics.median(medians['ring']) / statistics.median(medians['gloo']):.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
