"""How the bench times: each implementation in a pass of its own at each size, a barrier
before each call, the slowest rank's time, the median over iterations; and the memory-copy
reference.

At each size every implementation runs all its calls (ring ..., then mpi ..., then gloo ...),
so that none runs between another's calls and disturbs them (``time_each``). Each call is timed
alone on every rank, between a barrier and its return; the iteration's time is the slowest
rank's, since a collective is done only when every rank has its result. Checking the result
happens after the clock stops.

Ctrl-C: a rank must never leave the sweep alone, or the others wait for it for ever
inside MPI. So Ctrl-C only raises a flag (``cmdline.interrupt``), which the barrier
before each call carries to every rank: all of them stop at the same call, with
KeyboardInterrupt. A second Ctrl-C stops this rank at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from mpi4py import MPI

from bench.cases import Case
import collectives as col
from cmdline import interrupt


@dataclass(frozen=True)
class Timing:
    """One implementation at one size: the median seconds and the most wrong elements in any iteration."""
    seconds: float
    wrong: int


def default_iterations(nbytes: int) -> int:
    """Timed iterations for a size when --iters is not given: about 1 GiB moved, 10 to 1000.

    >>> default_iterations(8), default_iterations(64 << 20), default_iterations(256 << 20)
    (1000, 16, 10)
    """
    return max(10, min(1000, (1 << 30) // max(nbytes, 1)))


def time_each(comm: MPI.Comm, case: Case, impls: list[str], iters: int, warmup: int,
              plant_error: str | None = None) -> dict[str, Timing]:
    """Time ``impls`` on ``case``, each in a pass of its own: ``warmup`` checked but untimed calls,
    then ``iters`` timed ones, before the next implementation starts. Interleaved calls disturbed
    each other: with gloo's 1.65 ms call between two of ours, ours took 35.9 us at 32 B instead of
    7.1 (and MPI's 5.4 instead of 3.3): caches, predictors and the scheduler were left to the other.

    ``plant_error``: after each call of that implementation one element of the last rank's result
    is overwritten before the check (to test that the checker catches it).
    """
    return {impl: _time_pass(comm, case, impl, iters, warmup, impl == plant_error) for impl in impls}


def _time_pass(comm: MPI.Comm, case: Case, impl: str, iters: int, warmup: int, plant: bool) -> Timing:
    seconds = np.zeros(iters)
    wrong = np.zeros(warmup + iters, np.int64)
    planter = comm.Get_size() - 1
    for i in range(warmup + iters):
        case.reset(impl)
        if case.on_device:
            case.synchronize()
        barrier(comm)
        start = time.perf_counter()
        result = case.run(impl)
        if case.on_device:
            case.synchronize()   # a GPU call returns with its work queued: time the work
        elapsed = time.perf_counter() - start
        if plant and comm.Get_rank() == planter and result.size:
            result.reshape(-1)[-1] = case.sentinel
        wrong[i] = case.wrong(result)
        if i >= warmup:
            seconds[i - warmup] = elapsed
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)    # each iteration took as long as its slowest rank
    comm.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)      # wrong elements on all ranks, per iteration
    return Timing(float(np.median(seconds)), int(wrong.max()))


def barrier(comm: MPI.Comm) -> None:
    """A barrier that also agrees whether to stop: KeyboardInterrupt on every rank if any rank
    was asked to (a one-integer all-reduce synchronizes as a barrier does)."""
    anyone = np.zeros(1, np.int32)
    comm.Allreduce(np.array([interrupt.requested()], np.int32), anyone, op=MPI.MAX)
    if anyone[0]:
        raise KeyboardInterrupt


def copy_bandwidth(comm: MPI.Comm, nbytes: int = 64 << 20, repeats: int = 10, xp: ModuleType = np) -> float:
    """Bytes per second ``xp.copyto`` moves on rank 0 alone (median of ``repeats`` copies of ``nbytes``):
    host memory for numpy, device memory (device-to-device) for cupy.

    The other ranks wait without spinning, so the figure is one process's copy
    bandwidth: the physical ceiling a one-process-per-rank transport works under.
    """
    result = np.zeros(1)
    if comm.Get_rank() == 0:
        source, target = xp.ones(nbytes, np.uint8), xp.empty(nbytes, np.uint8)
        xp.copyto(target, source)    # first touch: page faults are not copying
        col.synchronize(target)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            xp.copyto(target, source)
            col.synchronize(target)
            times.append(time.perf_counter() - start)
        result[0] = nbytes / float(np.median(times))
    everyone_here = comm.Ibarrier()
    while not everyone_here.Test():
        time.sleep(1e-3)
    comm.Bcast(result, root=0)
    return float(result[0])
