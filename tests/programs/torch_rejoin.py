"""torch.distributed across a change of the world:
``mpiexec -disable-auto-cleanup -n 4 python -m tests.programs.torch_rejoin HOW``.

Rank 3 SIGKILLs itself while the others have an all_reduce in flight; the survivors (under
``col.elastic.run``) try the process groups of the world before, then make the process group
again, HOW:

  default    init_process_group("ring")
  explicit   init_process_group("ring", rank=col.rank(), world_size=col.size())
  url        init_process_group("ring", init_method="env://")

Each survivor prints ``rank R: CHECK OUTCOME`` (OUTCOME: ``raised <type>: <message>`` or
``returned <values>``) for these CHECKs:

  in_flight  wait() on the all_reduce that was in flight when rank 3 died
  old_sync   dist.all_reduce on the old default group, after the change
  old_async  the old process group's allreduce(), after the change and its destroy
  old_group  dist.all_reduce on a dist.new_group([0, 1, 2]) made before the change
  new        the new process group: its rank, its size, an all_reduce of rank + 1
"""
import collectives as col
col.elastic.supervise()   # first thing: the survivors of a SIGKILL must outlive MPICH's proxy

import os
import signal
import sys

import torch
import torch.distributed as dist

import collectives.torch  # noqa: F401,E402 - registers "ring"


def outcome(call) -> str:
    try:
        return f"returned {call()}"
    except Exception as error:   # noqa: BLE001 - the report is the point
        return f"raised {type(error).__name__}: {error}".replace("\n", " ")


def main(how: str) -> None:
    dist.init_process_group("ring")
    first_rank = dist.get_rank()
    trio = dist.new_group([0, 1, 2])
    pending = []

    def report(check: str, call) -> None:
        print(f"rank {first_rank}: {check} {outcome(call)}", flush=True)

    def work(state: col.elastic.State) -> list:
        if not pending:   # (the first world only)
            if first_rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            pending.append(dist.all_reduce(torch.ones(2), async_op=True))
            dist.all_reduce(torch.ones(2))   # (raises: rank 3 never came; the async one fails unseen)
        t = torch.full((2,), dist.get_rank() + 1.0)
        dist.all_reduce(t)
        return t.tolist()

    def rejoin(state: col.elastic.State, change: col.elastic.Change) -> None:
        report("in_flight", lambda: pending[0].wait())
        report("old_sync", lambda: dist.all_reduce(torch.ones(2)))
        report("old_group", lambda: dist.all_reduce(torch.ones(2), group=trio))
        old = dist.group.WORLD
        dist.destroy_process_group()
        report("old_async", lambda: old.allreduce([torch.ones(2)]).wait())
        if how == "explicit":
            dist.init_process_group("ring", rank=col.rank(), world_size=col.size())
        elif how == "url":
            dist.init_process_group("ring", init_method="env://")
        else:
            dist.init_process_group("ring")

    state = col.elastic.State(step=0)
    state.on_change(rejoin)
    result = col.elastic.run(work, state)
    report("new", lambda: [dist.get_rank(), dist.get_world_size(), result])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
