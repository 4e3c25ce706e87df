"""``python -m trainer`` whose rank 1 SIGKILLs itself right after global step N, in torchrun's first
round only (TORCHELASTIC_RESTART_COUNT 0): ``torchrun --max-restarts 1 ... tests/programs/torchrun_kill.py
N [trainer flags]``. The second round forms a new world and resumes from the checkpoint."""
import os
import signal
import sys

from trainer.__main__ import run
from trainer.strategies import allreduce

AFTER = int(sys.argv[1])
_step = allreduce.step


def step_then_die(loop, state, *args) -> None:
    _step(loop, state, *args)
    if state.step == AFTER and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and os.environ["RANK"] == "1":
        print(f"rank 1 killed after step {AFTER}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


allreduce.step = step_then_die
run(sys.argv[2:])
