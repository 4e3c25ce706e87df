"""Faults on the GPU path, as a user's program: ``mpiexec -n 2 python -m tests.programs.gpu_faults SCENARIO``
(with ``COLLECTIVES_GPU_TRANSPORT=nccl`` where NCCL can carry the ranks).

- ``absent``: the last rank stays away from a cupy all-reduce (until every other rank's call has
  ended: cued); the others must end the call with CollectiveError within its timeout, not wait
  inside NCCL for ever.
- ``killed``: rank 1 is SIGKILLed inside a cupy all-reduce, after a first one connected every pair;
  the others must end with CollectiveError, and the job must end (a communicator with a dead peer
  is aborted, not destroyed).

On the GPU a call may return once its work is queued, so each call here is followed by a stream
synchronization: the error may come from the call, from the synchronization's bound (the watchdog
aborts the communicator at the call's deadline), or from the next call. Each rank prints how it ended; one that crashes, or still runs after 60 s, prints its threads' stacks.
"""
import faulthandler
import os
import signal
import sys
import time

import cupy

import collectives as col
from collectives.groups.group import Group
from collectives.process.startup import world
from tests.programs.cues import await_cues, cue, say, when_inside

ELEMENTS = 16 << 20   # 64 MiB of float32: long enough on the GPU for a death to land inside a call


def _calls_until_an_error(x, timeout: float, seconds: float) -> None:
    """All-reduce ``x`` (each call synchronized) until one raises or ``seconds`` pass; say which."""
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            col.allreduce(x, out=x, op="max", timeout=timeout)
            cupy.cuda.get_current_stream().synchronize()
    except col.CollectiveError as e:
        say(f"rank {col.rank()}: CollectiveError after {time.monotonic() - started:.2f} s: {e}")
        return
    say(f"rank {col.rank()}: never noticed")


def absent() -> None:
    last = col.size() - 1
    x = cupy.ones(ELEMENTS, cupy.float32)
    col.allreduce(x, out=x, op="max")
    cupy.cuda.get_current_stream().synchronize()
    if col.rank() == last:
        await_cues(range(last))
        say(f"rank {col.rank()}: stayed away")
        return
    try:
        _calls_until_an_error(x, timeout=3, seconds=3)
    finally:
        cue(last)


def killed() -> None:
    x = cupy.ones(ELEMENTS, cupy.float32)
    col.allreduce(x, out=x, op="max")
    cupy.cuda.get_current_stream().synchronize()
    if col.rank() == 1:
        when_inside(Group.allreduce, lambda: os.kill(os.getpid(), signal.SIGKILL))
    _calls_until_an_error(x, timeout=5, seconds=60)
    raise SystemExit(3)


if __name__ == "__main__":
    faulthandler.enable()   # (a crash inside CUDA or NCCL shows where)
    faulthandler.dump_traceback_later(60, exit=True)   # (a hang shows where: every thread's stack, then exit 1)
    col.use_local_gpu()
    col.init(timeout=20)
    say(f"rank {col.rank()}: over {type(world().device_transport).__name__}")
    {"absent": absent, "killed": killed}[sys.argv[1]]()
