"""Elastic training: when a rank dies or its host vanishes, the survivors go on in-process, in a
world of their own, from the last commit; newcomers found by a host discovery script join at a
commit. No process restarts and no driver: the survivors agree on who is gone and make their
communicator with MPI itself (``collectives.process.startup.rebuild``).

    state = col.elastic.State(params=params, velocity=velocity, step=0)

    def train(state):
        while state.step < steps:
            grads = gradients(state.params, shard(state.step, col.rank(), col.size()))
            col.allreduce(grads, op="avg", out=grads)
            update(state.params, state.velocity, grads)
            state.step += 1
            state.commit()            # what a change rolls back to: kept in memory on every rank

    col.elastic.run(train, state, min_ranks=2)

Launch with ``mpiexec -disable-auto-cleanup`` (else MPICH's launcher kills every rank when one
dies). A change rolls every rank back to the last commit that rank 0 of the new world holds
(``State.sync``), so a step during which a rank died is done again by the survivors: the
result is the one a restart from that commit would give, bit for bit. An exception in the
program (not a death) still ends the job; so does a world smaller than ``min_ranks``.

Growth: with ``run(..., host_discovery="./hosts.sh", max_ranks=8)`` rank 0 runs the script in
the background (``collectives.elastic.discovery``); at a commit where it lists free slots, every member
spawns newcomers running this program (MPI's Comm_spawn: same interpreter, same arguments),
which join as the last ranks when they reach ``run`` and take rank 0's state. A newcomer runs
the program from the top: it must call ``supervise`` and build its ``State`` as the others did,
and make no collective call before ``run`` (``joining()`` says whether it is one).
See docs/elastic.md.

Where each part lives: ``loop`` (``run``: the job through every change; growth at a commit),
``state`` (``State``: what a change rolls back to), ``discovery`` (the host discovery script),
``supervisor`` (the parent process that stands between the launcher and each rank, and reports
the job's outcome). The world's own changes (survivors, newcomers) are ``collectives.process.changes``.

May import: every other part of ``collectives`` (it is the top floor but for ``torch``).
"""
from collectives.elastic.loop import Change, MembershipChanged, State, joining, run, supervise

__all__ = ["State", "run", "supervise", "joining", "Change", "MembershipChanged"]
