"""What the trainer's Ctrl-C check costs a step: one 1-byte all-reduce of the flag
(``trainer.common.stop_requested``), timed in 5 blocks of 2000 calls after a warm-up.

    mpiexec -n 2 python scripts/interrupt_cost.py
"""
import time

import numpy as np

import collectives as col
from cmdline.interrupt import stop_together
from trainer.common import stop_requested

with stop_together():
    for _ in range(200):
        stop_requested()
    blocks = []
    for _ in range(5):
        col.barrier()
        began = time.perf_counter()
        for _ in range(2000):
            stop_requested()
        blocks.append((time.perf_counter() - began) / 2000 * 1e6)
if col.rank() == 0:
    print(f"per-step Ctrl-C flag all-reduce at n={col.size()}: " + " ".join(f"{b:.1f}" for b in blocks)
          + f" us per block, median {np.median(blocks):.1f} us")
