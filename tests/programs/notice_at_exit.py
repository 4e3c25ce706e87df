"""Issue 36, item 4: what becomes of MPICH's failure notice (SIGUSR1, under -disable-auto-cleanup)
once the runtime has left. An exit handler registered before ``collectives`` is imported runs after
the runtime's own: it prints SIGUSR1's handler, then sends the process the signal."""
import atexit
import os
import signal


def after_the_runtime_left() -> None:
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    print(f"rank {rank}: SIGUSR1 at exit: {signal.getsignal(signal.SIGUSR1)!r}", flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    print(f"rank {rank}: survived a notice at exit", flush=True)


atexit.register(after_the_runtime_left)

import numpy as np  # noqa: E402

import collectives as col  # noqa: E402

col.allreduce(np.ones(3))
