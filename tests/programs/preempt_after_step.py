"""``python -m trainer`` whose rank 0 sends itself SIGTERM right after global step N:

    mpiexec -n 2 python tests/programs/preempt_after_step.py N [trainer flags]

A signal from outside lands wherever the run happens to be; this one lands at a chosen step, such
as an epoch's last (the run then ends the epoch, records and checkpoints it, and stops before the
next one), which a test needs to see a preemption at an epoch boundary every time."""
import os
import signal
import sys

import collectives as col
from trainer.__main__ import run
from trainer.strategies import allreduce

AFTER = int(sys.argv[1])
_step = allreduce.step


def step_then_sigterm(loop, state, *args) -> None:
    """``allreduce.step``, then SIGTERM to this process on rank 0 once the global step is AFTER."""
    _step(loop, state, *args)
    if state.step == AFTER and col.rank() == 0:
        os.kill(os.getpid(), signal.SIGTERM)


allreduce.step = step_then_sigterm
run(sys.argv[2:])
