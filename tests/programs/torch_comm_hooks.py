"""DDP's communication hooks on the "ring" backend against gloo, in one MPI world:
``mpiexec -n N python -m tests.programs.torch_comm_hooks [--steps 6] [--time 0]``.

The default process group is gloo (over loopback); "ring" is a second group over the same ranks.
For each hook (fp16_compress_hook, bf16_compress_hook, powerSGD_hook, batched_powerSGD_hook) the
same model, seed and rank-dependent data train on each group; rank 0 prints one line per check,
``CHECK <hook> <what>: ok`` or ``... FAILED <why>``:

* ``replicas``: on ring, every rank's parameters are bit for bit the same after every step;
* ``gloo``: ring's parameters against gloo's after every step. Equal where both round the
  same sums alike: every hook at n <= 2 (a sum of two is rounded once, whatever the order). At
  n = 3 the sums are rounded differently (a bfloat16 sum: the ring adds in float32 and rounds
  once, gloo rounds after each addition; a float16 or float32 sum: both round after each
  addition, each in its own order), and training carries a difference of a last bit through
  every later step, so the check there is a tolerance, TOLERANCE_N3, each with its reason;
* ``sums`` (the compressing hooks, n >= 2): one bucket's all-reduce in the hook's dtype, the
  inputs gathered so every rank computes the exact sum in float64: the ring's bfloat16 sum is
  that sum rounded to bfloat16 once; each backend's sum is within the bound of summing n
  values with a rounding after each addition, (n - 1) * u * sum|x| (u: the dtype's unit
  roundoff); at n = 2 ring's and gloo's are bit for bit equal.

Two of torch's own limits are worked around alike for both backends, and said so on the output:
DDP refuses ``bf16_compress_hook`` by its name where torch has no CUDA and NCCL (so it is
registered through a function of another name that calls it), and torch 2.13's
``batched_powerSGD_hook`` hands ``_orthogonalize`` a 2-D matrix, which it refuses (an
``AssertionError`` on every backend; viewed here as a batch of one, only where torch refuses it).

``--time K``: K steps more per hook and backend, and rank 0 prints each one's median step
time (ms); timings are printed, never checked. ``--width W``: a model of 25 W + 4 parameters
(``--depth D``: D - 1 more hidden layers of W x W). ``--bucket-cap-mb`` small gives DDP several
buckets, whose hooks' calls interleave with each other's callbacks (PowerSGD issues P and Q from
inside them); ``--min-buckets K`` adds the check ``buckets``: DDP made at least K on each backend.
gloo cannot be the reference there as it is: it pairs calls by the order each rank issues them,
and PowerSGD's callbacks (run by gloo's threads as the calls finish) issue P and Q in an order
that differs from rank to rank (gloo aborts: ``Received data size doesn't match expected size``).
``--gloo-in-order`` makes gloo's hook wait for its bucket's calls before it returns: the order
ring keeps without waiting (each bucket's P and Q right after its first all-reduce), and the
same arithmetic, since PowerSGD computes each bucket on its own.
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401 - registers "ring"
from tests.worlds import free_port

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
HOOKS = ["fp16", "bf16", "powerSGD", "batched_powerSGD"]
#: Unit roundoff (half the distance from 1 to the next value) of each compressed dtype.
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
#: Ring against gloo at n = 3, where their sums round differently: the largest absolute difference
#: of any parameter over the steps (the parameters are 0.01-0.5; lr 0.05, momentum 0.9, 6 steps).
#: Measured here: fp16 1.8e-5 and bf16 1.2e-4 (a last bit of the half-precision sum, 2^-11 and
#: 2^-8 of a gradient, times lr / (1 - momentum), carried into every later step), powerSGD and
#: batched 1.5e-8 (a last bit of float32 sums of P and Q). Each bound is about 4x the measured:
#: the inputs are seeded, so what moves them is only another machine's float kernels.
TOLERANCE_N3 = {"fp16": 8e-5, "bf16": 5e-4, "powerSGD": 6e-8, "batched_powerSGD": 6e-8}


def bf16_hook(group, bucket):   # (no annotations: DDP compares them with its types, and here they are strings)
    """torch's ``bf16_compress_hook`` under another name: DDP's ``register_comm_hook`` refuses it
    by name unless torch has CUDA and NCCL, on gloo too, though it runs on CPU. (group: a process
    group; bucket: a ``dist.GradBucket``; returns a ``Future[Tensor]``)"""
    return default_hooks.bf16_compress_hook(group, bucket)


def shim_batched_orthogonalize() -> bool:
    """Let torch's ``_orthogonalize`` take the 2-D matrix ``batched_powerSGD_hook`` passes (as a
    batch of one: the same memory, written in place), where this torch refuses it. Whether it did."""
    original = powerSGD_hook._orthogonalize
    try:
        original(torch.ones(2, 1))
        return False
    except AssertionError:
        powerSGD_hook._orthogonalize = lambda m, epsilon=0: original(m.unsqueeze(0) if m.dim() == 2 else m, epsilon)
        return True


def hook_for(name: str, group: Any) -> tuple[Any, Callable]:
    """(state, hook) for ``register_comm_hook``, on ``group``."""
    if name == "fp16":
        return group, default_hooks.fp16_compress_hook
    if name == "bf16":
        return group, bf16_hook
    # Compression from step 2 on (steps 0 and 1 all-reduce plainly), with error feedback and warm start.
    state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                        random_seed=0)
    return state, powerSGD_hook.powerSGD_hook if name == "powerSGD" else powerSGD_hook.batched_powerSGD_hook


def model(width: int, depth: int = 1) -> torch.nn.Module:
    torch.manual_seed(RANK + 1)   # different on every rank: DDP's broadcast from rank 0 must make them one
    hidden = [layer for _ in range(depth - 1) for layer in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    return torch.nn.Sequential(torch.nn.Linear(20, width), torch.nn.Tanh(), *hidden, torch.nn.Linear(width, 4))


def train(group: Any, name: str, steps: int, timed: int = 0, width: int = 32, bucket_cap_mb: float | None = None,
          depth: int = 1, before_step: Callable[[int], None] | None = None,
          in_order: bool = False) -> tuple[list[torch.Tensor], list[float], int]:
    """The parameters after each step, the times of ``timed`` more steps (s), and how many buckets
    DDP made. ``before_step(step)``: called before each step (DDP made). ``in_order``: the hook
    waits for its bucket's future before it returns, so that the calls its callbacks issue come
    before the next bucket's on every rank (see ``--gloo-in-order``)."""
    ddp = DDP(model(width, depth), process_group=group, bucket_cap_mb=bucket_cap_mb)
    state, hook = hook_for(name, group)
    buckets = set()

    def counted(state, bucket):   # (no annotations: see bf16_hook)
        buckets.add(bucket.index())
        future = hook(state, bucket)
        if in_order:
            future.wait()
        return future
    ddp.register_comm_hook(state, counted)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + RANK)
    params, times = [], []
    for step in range(steps + timed):
        if before_step is not None:
            before_step(step)
        started = time.perf_counter()
        x, y = torch.randn(16, 20, generator=data), torch.randn(16, 4, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step < steps:
            params.append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]))
        else:
            times.append(time.perf_counter() - started)
    return params, times, len(buckets)


def check(hook: str, what: str, ok: bool, why: str) -> bool:
    """One verdict for every rank (ok where every rank's is), printed by rank 0."""
    ok = all(COMM.allgather(bool(ok)))
    if RANK == 0:
        print(f"CHECK {hook} {what}: {'ok' if ok else 'FAILED ' + why}", flush=True)
    return ok


def compare(hook: str, ring: list[torch.Tensor], gloo: list[torch.Tensor]) -> bool:
    """The checks ``replicas`` and ``gloo`` (see the module docstring)."""
    everyone = COMM.allgather([p.numpy().tobytes() for p in ring])
    replicas = all(everyone[r][s] == everyone[0][s] for r in range(N) for s in range(len(ring)))
    ok = check(hook, "replicas", replicas, "ring's replicas differ")
    worst = max(float((a - b).abs().max()) for a, b in zip(ring, gloo))
    if N <= 2:
        equal = all(torch.equal(a, b) for a, b in zip(ring, gloo))
        return check(hook, "gloo", equal, f"not equal to gloo's at n={N}: max |ring - gloo| {worst:.3g}") and ok
    if RANK == 0:
        print(f"{hook}: n={N}: max |ring - gloo| over every step {worst:.3g}, "
              f"last step {float((ring[-1] - gloo[-1]).abs().max()):.3g}", flush=True)
    return check(hook, "gloo", worst <= TOLERANCE_N3[hook],
                 f"max |ring - gloo| {worst:.3g} > {TOLERANCE_N3[hook]:g}") and ok


def sums(hook: str, dtype: torch.dtype, ring: Any, gloo: Any) -> bool:
    """The check ``sums``: one bucket's compressed all-reduce (as the hook makes it: the float32
    gradient cast to ``dtype``, then divided by n) on each backend, against the exact sum."""
    grad = torch.randn(4096, generator=torch.Generator().manual_seed(7 + RANK)) * 10.0 ** (RANK % 3 - 1)
    x = grad.to(dtype).div_(N)
    on_ring, on_gloo = x.clone(), x.clone()
    dist.all_reduce(on_ring, group=ring)
    dist.all_reduce(on_gloo, group=gloo)
    inputs = np.stack([np.asarray(v, np.float64) for v in COMM.allgather(x.float().tolist())])
    exact, magnitude = inputs.sum(axis=0), np.abs(inputs).sum(axis=0)
    bound = (N - 1) * UNIT_ROUNDOFF[dtype] * magnitude * (1 + N * UNIT_ROUNDOFF[dtype])   # (the second order too)
    within = all(np.all(np.abs(v.double().numpy() - exact) <= bound) for v in (on_ring, on_gloo))
    ok = check(hook, "sums", within, "a sum outside (n - 1) u sum|x| of the exact one")
    if dtype == torch.bfloat16:
        once = torch.from_numpy(exact).to(torch.bfloat16)
        ok = check(hook, "sums-once", torch.equal(on_ring, once), "ring's bfloat16 sum is not the exact sum "
                   f"rounded once ({int((on_ring != once).sum())} of {x.numel()} differ)") and ok
    if N <= 2:
        ok = check(hook, "sums-gloo", torch.equal(on_ring, on_gloo), "ring's sum is not gloo's") and ok
    elif RANK == 0:
        differ = on_ring != on_gloo
        print(f"{hook}: n={N}: ring's and gloo's sums differ in {int(differ.sum())} of {x.numel()} elements", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--time", type=int, default=0, metavar="K", help="time K more steps per hook and backend")
    parser.add_argument("--hooks", default=",".join(HOOKS))
    parser.add_argument("--width", type=int, default=32, help="hidden units (the checks' tolerances are for 32)")
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's (default: DDP's own, 25)")
    parser.add_argument("--depth", type=int, default=1, help="hidden layers (tolerances: for 1; PowerSGD's for 3)")
    parser.add_argument("--min-buckets", type=int, default=0, help="check that DDP made at least this many")
    parser.add_argument("--gloo-in-order", action="store_true", help="gloo's hook waits for its bucket's calls")
    args = parser.parse_args()
    port = COMM.bcast(free_port() if RANK == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=N,
                            timeout=timedelta(seconds=120))
    ring, gloo = dist.new_group(backend="ring"), dist.group.WORLD
    if shim_batched_orthogonalize() and RANK == 0:
        print("note: this torch's _orthogonalize refuses batched_powerSGD_hook's 2-D matrix; viewed as a batch of one")
    ok, timings = True, {}
    for hook in args.hooks.split(","):
        shape = (args.width, args.bucket_cap_mb, args.depth)
        ring_params, ring_times, ring_buckets = train(ring, hook, args.steps, args.time, *shape)
        gloo_params, gloo_times, gloo_buckets = train(gloo, hook, args.steps, args.time, *shape,
                                                      in_order=args.gloo_in_order)
        if args.min_buckets:
            if RANK == 0:
                print(f"{hook}: DDP made {ring_buckets} buckets on ring, {gloo_buckets} on gloo", flush=True)
            ok = check(hook, "buckets", min(ring_buckets, gloo_buckets) >= args.min_buckets,
                       f"DDP made {ring_buckets} bucket(s) on ring, {gloo_buckets} on gloo") and ok
        ok = compare(hook, ring_params, gloo_params) and ok
        if hook in ("fp16", "bf16") and N > 1:
            ok = sums(hook, torch.float16 if hook == "fp16" else torch.bfloat16, ring, gloo) and ok
        timings[hook] = (ring_times, gloo_times)
    if args.time and RANK == 0:
        print(f"median step time over {args.time} steps, n={N} (ms): hook ring gloo ring/gloo")
        for hook, (r, g) in timings.items():
            r_ms, g_ms = 1e3 * statistics.median(r), 1e3 * statistics.median(g)
            print(f"{hook} {r_ms:.2f} {g_ms:.2f} {r_ms / g_ms:.2f}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
