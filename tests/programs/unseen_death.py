"""A rank that dies before any other rank's supervisor has looked:
``mpiexec -disable-auto-cleanup -n 3 python -m tests.programs.unseen_death``.

Rank 1 ends first thing (status 1, as a failed import would), before it imports anything (a
SIGKILL there would have MPICH's proxy kill the whole host: only supervised ranks survive one). The others start their
supervisor (``col.elastic.supervise``) only once it is gone (the cue: the launcher's proxy has
fewer children than it started), so none of them ever sees it; they must still end, saying so,
instead of waiting inside MPI_Init for ever.
"""
import os
import time

if os.environ.get("PMI_RANK") == "1":
    os._exit(1)


def _proxy_children() -> int:
    proxy = os.getppid()
    with open(f"/proc/{proxy}/task/{proxy}/children") as f:
        return len(f.read().split())


while _proxy_children() >= int(os.environ["MPI_LOCALNRANKS"]):
    time.sleep(0.01)

import collectives as col  # noqa: E402 - only once rank 1 is gone

col.elastic.supervise()
col.init(timeout=30)
print(f"rank {col.rank()}: MPI started without rank 1 (wrong)", flush=True)
