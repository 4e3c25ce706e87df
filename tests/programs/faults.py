"""Fault scenarios for tests/test_faults.py, run as a user's program: ``mpiexec -n N python -m
tests.programs.faults SCENARIO``. Each rank prints one line saying how it ended."""
import os
import signal
import sys
import threading
import time

import numpy as np

import collectives as col


def absent() -> None:
    """The last rank never comes to the allreduce; the others must time out naming it."""
    if col.rank() == col.size() - 1:
        time.sleep(6)
        print(f"rank {col.rank()}: stayed away", flush=True)
        return
    x = np.ones(1000, np.float32)
    try:
        col.allreduce(x, timeout=2)
    except col.CollectiveError as e:
        print(f"rank {col.rank()}: CollectiveError: {e}", flush=True)
    try:
        col.allreduce(x, timeout=2)
    except col.CollectiveError as e:
        print(f"rank {col.rank()}: then: {e}", flush=True)
        raise SystemExit(3)


def killed_mid_allreduce() -> None:
    """Rank 1 is SIGKILLed while a large allreduce is under way on every rank."""
    x = np.ones(16 << 20, np.float32)   # 64 MiB: each call takes long enough to be hit in the middle
    if col.rank() == 1:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < 60:
            col.allreduce(x, out=x, op="max")
    except col.CollectiveError as e:
        print(f"rank {col.rank()}: CollectiveError after {time.monotonic() - started:.1f} s: {e}", flush=True)
        raise SystemExit(3)
    print(f"rank {col.rank()}: never noticed", flush=True)


if __name__ == "__main__":
    {"absent": absent, "killed": killed_mid_allreduce}[sys.argv[1]]()
