"""``mpiexec -n N python -m tests.programs.late_signal SIGNAL RANK TRAINER-FLAGS...``: the trainer, then
SIGNAL (SIGTERM, SIGINT) sent to rank RANK by itself as its process ends, after the trainer's last line
and before the runtime's own exit (the farewell, the exit barrier, MPI_Finalize), as a batch system's
SIGTERM or a Ctrl-C that comes once the job's work is done. Exits as ``python -m trainer`` does."""
import atexit
import os
import signal
import sys

import collectives as col
from trainer.__main__ import main


def _signal_self(which: str, victim: int) -> None:
    if col.rank() == victim:
        os.kill(os.getpid(), getattr(signal, which))
        print(f"rank {victim}: sent itself {which} at exit", flush=True)


if __name__ == "__main__":
    code = main(sys.argv[3:])
    atexit.register(_signal_self, sys.argv[1], int(sys.argv[2]))   # (after the runtime's: runs before it)
    sys.exit(code)
