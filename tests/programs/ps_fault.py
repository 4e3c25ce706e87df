"""A parameter-server run in which one rank misbehaves after a few steps, as a user's bug would:
``mpiexec -n 3 python -m tests.programs.ps_fault ROLE HOW [trainer flags]``, ROLE "server" (the
last rank) or "worker" (rank 1), HOW "raises" (an exception) or "stalls" (sleeps for an hour)."""
import sys
import time

import collectives as col
from trainer import __main__ as trainer
from trainer.strategies import ps

ROLE, HOW = sys.argv[1], sys.argv[2]


def misbehaving(original):
    calls = [0]

    def step(self, *args, **kwargs):
        calls[0] += 1
        victim = col.size() - 1 if ROLE == "server" else 1
        if col.rank() == victim and calls[0] == 20:
            if HOW == "raises":
                raise RuntimeError(f"a bug in the {ROLE}")
            time.sleep(3600)
        return original(self, *args, **kwargs)
    return step


if ROLE == "server":
    ps.Server._apply = misbehaving(ps.Server._apply)
else:
    ps.Worker.push = misbehaving(ps.Worker.push)
trainer.run(sys.argv[3:])
