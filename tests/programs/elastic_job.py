"""A small ``col.elastic`` job for the tests and the measurements of docs/elastic.md.

    mpiexec -disable-auto-cleanup -n 4 python -m tests.programs.elastic_job --steps 120 --kill 3@50

Each step every rank draws a gradient from (step, its rank, the world's size), the ranks average
it, and the weights take a momentum step: floating-point rounding makes the result depend on
every detail (who took part, in which order), so a bit-identical result means the same
computation. ``--kill R@S``: the process the launcher started as rank R SIGKILLs itself before
step S (the state then holds the commit of step S); it prints ``killed at <time>`` first.
``--kill-at-exit R``: once the work is done (after ``final``) that process ends its program and
SIGKILLs itself inside the runtime's exit, once it waits there for the others (its exit barrier);
they end their programs only once its process has ended. ``--kill-in-finalize R``: that process
SIGKILLs itself once its exit barrier has passed, as it goes into MPI_Finalize (the others are
at exit too, most of them past their barrier).
``--die-agreeing R``: that process dies in the survivors' agreement after the first death (its
message of the first round sent to the lowest survivor alone: the gap of ``ring.transport.mpi.survivors``).
``--raise R@S``: that process raises ValueError instead (an error of the program, which ends the
job). ``--stuck R@S``: that process sleeps for an hour instead (stuck in its own code).
``--die-before-mpi R``: that process SIGKILLs itself before MPI starts (before ``col.init``). ``--save-at S PATH``: stop before step S and write the state (rank 0); ``--load PATH``:
start from such a file (the reference: a restart from a checkpoint). ``--stale``: a group made
at the start, and an async call issued in the step of a kill, both of the world before; after
each change the job shows that they raise MembershipChanged.
At the end rank 0 prints ``final <digest>`` after checking that every rank holds the same bits.
"""
import collectives as col

col.elastic.supervise()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

SIZE = 20000


def cue(text: str) -> tuple[int, int]:
    rank, step = text.split("@")
    return int(rank), int(step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--kill", type=cue, action="append", default=[])
    p.add_argument("--die-agreeing", type=int, default=-1)
    p.add_argument("--kill-at-exit", type=int, default=-1, help="this launched rank SIGKILLs itself at the end")
    p.add_argument("--kill-in-finalize", type=int, default=-1, help="this launched rank SIGKILLs itself in MPI_Finalize")
    p.add_argument("--raise", dest="raise_", type=cue, action="append", default=[])
    p.add_argument("--stuck", type=cue, action="append", default=[])
    p.add_argument("--die-before-mpi", type=int, default=-1, help="this launched rank SIGKILLs itself first thing")
    p.add_argument("--save-at", nargs=2)
    p.add_argument("--load")
    p.add_argument("--min-ranks", type=int, default=1)
    p.add_argument("--stale", action="store_true")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in each step (a slower job)")
    args = p.parse_args()
    launched_as = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if args.die_before_mpi == launched_as:
        print(f"killed before MPI started at {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    col.init(timeout=args.timeout)
    if args.die_agreeing == launched_as:
        die_in_the_agreement()
    state = col.elastic.State(weights=np.zeros(SIZE), velocity=np.zeros(SIZE), step=0)
    if args.load:
        saved = np.load(args.load)
        state.weights[...], state.velocity[...], state.step = saved["weights"], saved["velocity"], int(saved["step"])
    stop = int(args.save_at[0]) if args.save_at else args.steps
    before = {}
    if args.stale:
        before["group"] = col.new_group(list(range(col.size())))
        state.on_change(lambda state, change: show_stale(before))
    changed = {"at": None}
    state.on_change(lambda state, change: changed.update(at=time.time()))

    def train(state):
        while state.step < stop:
            for rank, step in args.kill:
                if rank == launched_as and step == state.step:
                    print(f"killed at {time.time():.6f}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            for rank, step in args.raise_:
                if rank == launched_as and step == state.step:
                    raise ValueError(f"the program's own error at step {step}")
            for rank, step in args.stuck:
                if rank == launched_as and step == state.step:
                    print(f"stuck at step {step}", flush=True)
                    time.sleep(3600)
            n, me = col.size(), col.rank()
            grads = np.random.default_rng([state.step, me, n]).standard_normal(SIZE)
            if args.stale and "work" not in before and state.step in {step for _, step in args.kill}:
                before["work"] = col.allreduce(np.ones(4), async_op=True)
            col.allreduce(grads, op="avg", out=grads)
            state.velocity *= 0.9
            state.velocity += grads
            state.weights -= 0.01 * state.velocity
            state.step += 1
            state.commit()
            if args.step_seconds:
                time.sleep(args.step_seconds)
                if me == 0 and state.step % 10 == 0:
                    print(f"step {state.step} on {n} ranks", flush=True)
            if changed["at"] is not None and me == 0:
                print(f"first step after the change done at {time.time():.6f} ({time.time() - changed['at']:.3f} s "
                      "after the world was rebuilt)", flush=True)
                changed["at"] = None

    col.elastic.run(train, state, min_ranks=args.min_ranks)
    digest = hashlib.blake2b(state.weights.tobytes() + state.velocity.tobytes(), digest_size=8).hexdigest()
    every = col.allgather(np.frombuffer(bytes.fromhex(digest), np.uint8)[None, :])
    assert all((row == every[0]).all() for row in every), f"the ranks differ: {every}"
    if args.save_at and col.rank() == 0:
        np.savez(args.save_at[1], weights=state.weights, velocity=state.velocity, step=np.int64(state.step))
    if col.rank() == 0:
        print(f"final {digest} at step {state.step} on {col.size()} ranks", flush=True)
    if args.kill_at_exit >= 0:
        kill_at_exit(args.kill_at_exit, launched_as)
    if args.kill_in_finalize == launched_as:
        kill_in_finalize()


def kill_at_exit(victim: int, launched_as: int) -> None:
    """The process launched as ``victim`` dies inside the runtime's exit, once it waits there for
    the others (its farewell said); the others end their programs only once it has died (cues,
    not times: on a busy machine they could come first, or it could die before its farewell)."""
    from ring.transport.mpi.exits import Exits
    from tests.programs.cues import await_ended, when_inside
    pids = col.allgather(np.array([[launched_as, os.getpid()]], np.int64))
    if launched_as == victim:
        when_inside(Exits.exit_barrier, lambda: (print(f"killed at exit at {time.time():.6f}", flush=True),
                                                  os.kill(os.getpid(), signal.SIGKILL)))
    else:
        await_ended([int(pid) for launched, pid in pids if launched == victim])


def kill_in_finalize() -> None:
    """Die the moment the runtime tells this process's supervisor that it goes into MPI_Finalize,
    the elastic job finished (after the exit barrier: cued by the runtime's own word, not a time)."""
    from collectives.process import supervision
    tell = supervision.tell

    def tell_then_die(word: supervision.Word, last: bool = False) -> None:
        tell(word, last)
        if word == supervision.Word.FINALIZING:
            print(f"killed in MPI_Finalize at {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    supervision.tell = tell_then_die


def die_in_the_agreement() -> None:
    """Send this rank's first message of the agreement to the lowest survivor alone, then die: that
    survivor hears every set of the round equal and ends it, the others go on to the next."""
    from mpi4py import MPI
    from ring.transport.mpi import survivors   # (imported once MPI runs)

    def exchange_then_die(transport, alive, mine, tag, until):
        transport.comm.Send([mine, MPI.BYTE], min(alive), tag)
        print(f"killed at {time.time():.6f} in the agreement", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    survivors._exchange = exchange_then_die


def show_stale(before: dict) -> None:
    try:
        before["group"].allreduce(np.ones(2))
        print("stale group: no error", flush=True)
    except col.MembershipChanged as e:
        print(f"stale group: MembershipChanged: {e}", flush=True)
    work = before.get("work")
    if work is not None:
        try:
            work.wait()
            print("stale work: completed before the change", flush=True)
        except col.MembershipChanged as e:
            print(f"stale work: MembershipChanged: {e}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except col.CollectiveError as e:
        print(f"[rank {col.rank()}] error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
