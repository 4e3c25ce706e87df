"""An elastic job that grows: training whose result does not depend on the world's size, so that a
run that lost ranks and gained newcomers must end with the weights of a run alone, bit for bit.

    mpiexec -disable-auto-cleanup -n 2 python tests/programs/elastic_grow.py --steps 40 \\
        --discovery "echo localhost:3" --grow-to 3 --out /tmp/w.npy

Each step's global batch of BATCH examples is split among the ranks; a rank sums the gradients
of its share, the all-reduce sums the shares. Every value is a whole number (far below 2**53),
so the sums are exact in any order and the weights are the same for any number of ranks; the
gradient depends on the weights, so a step applied twice or lost would show.

``--grow-to K``: after the last step, keep committing (one commit a ``--sleep``, at most
``--wait-commits``) until the world has K ranks, so that a slow machine cannot end the job
before the newcomers came. ``--kill R:S``: the process that the launcher made rank R dies by
SIGKILL at step S; ``--die-spawning R``: during the first spawn (``--notice-spawning R``: gets
the launcher's notice of a death, SIGUSR1, there, as of a death before the spawn);
``--notice-joined``: each newcomer's supervisor gets one at the newcomer's first step;
``--die-joining PATH``: the first newcomer to make PATH ends before MPI starts (as one whose
MPI_Init failed). ``--log PATH``: rank 0 appends ``commit N`` to PATH after each commit that did
not grow the world, N ranks (the growth check of that commit passed). Every rank prints one line
at the end (``done``), rank 0 writes the weights.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

import numpy as np

BATCH, SIZE = 12, 1000


def gradient(w: np.ndarray, step: int, examples) -> np.ndarray:
    """The sum of the gradients of ``examples`` at ``step``: whole numbers, bounded, and a
    function of the weights."""
    g = np.zeros_like(w)
    positions = np.arange(w.size)
    for i in examples:
        g += (positions * (i + 1) + step) % 7 - 3 + np.fmod(w, 5)
    return g


def reference(steps: int) -> np.ndarray:
    """The weights after ``steps`` steps, computed alone (no MPI)."""
    w = np.zeros(SIZE)
    for step in range(steps):
        w += gradient(w, step, range(BATCH))
    return w


def main() -> int:
    import collectives as col
    col.elastic.supervise()   # (first: before MPI starts)
    args = _arguments()
    launched_as = -1 if col.elastic.joining() else int(os.environ.get("PMI_RANK", "0"))
    if launched_as == args.die_spawning:
        _signal_while_spawning(signal.SIGKILL)
    if launched_as == args.notice_spawning:
        _signal_while_spawning(signal.SIGUSR1)
    if launched_as == -1 and args.die_joining and _made(args.die_joining):
        print(f"newcomer {os.getpid()}: ends before MPI starts", flush=True)
        os._exit(1)
    state = col.elastic.State(w=np.zeros(SIZE), step=0)

    def train(state):
        waited = 0   # (the same on every rank: each goes through the same commits)
        while state.step < args.steps or (col.size() < args.grow_to and waited < args.wait_commits):
            if state.step < args.steps:
                if (launched_as, state.step) in args.kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                if launched_as == -1 and args.notice_joined and not noticed:
                    noticed.append(os.kill(os.getppid(), signal.SIGUSR1))   # (its supervisor: a notice, as of a death)
                share = np.array_split(np.arange(BATCH), col.size())[col.rank()]
                g = col.allreduce(gradient(state.w, state.step, share))
                state.w += g
                state.step += 1
                if args.timing and launched_as == -1 and not timed:
                    timed.append(time.time())
                    print(f"newcomer {col.rank()}: first step done at {timed[0]:.6f}", flush=True)
            else:
                waited += 1
            time.sleep(args.sleep)
            try:
                state.commit()
            except Exception:
                if args.timing and col.rank() == 0:
                    print(f"rank 0: left a commit at {time.time():.6f} (size {col.size()})", flush=True)
                raise
            if args.log and col.rank() == 0:
                with open(args.log, "a") as log:
                    log.write(f"commit {col.size()}\n")
        return state.w

    timed: list = []
    noticed: list = []
    w = col.elastic.run(train, state, min_ranks=1, max_ranks=args.max_ranks, host_discovery=args.discovery,
                        discovery_interval=args.interval)
    print(f"[{launched_as}->{col.rank()}/{col.size()}] done step {state.step} sum {w.sum():.1f} on "
          f"{socket.gethostname()}", flush=True)
    if args.out and col.rank() == 0:
        np.save(args.out, w, allow_pickle=False)
    return 0


def _signal_while_spawning(signum: int) -> None:
    """This process sends itself ``signum`` inside MPI's spawn of the first newcomers (SIGKILL: it
    dies; SIGUSR1: a launcher's notice of a death elsewhere): once the thread that spawns is in the
    call (seen on its stack), not a time after the spawn began, which a busy machine could let pass
    before the call (a newcomer takes far longer to start and join)."""
    import threading
    from collectives.process import changes
    spawn = changes.spawn_newcomers

    class SignalledInSpawn:
        """The members' communicator, whose Spawn signals this process once MPI's spawn runs."""

        def __init__(self, comm):
            self._comm = comm

        def __getattr__(self, name):
            return getattr(self._comm, name)

        def Spawn(self, *args, **kwargs):  # noqa: N802 - (mpi4py's name)
            spawning, code = threading.get_ident(), SignalledInSpawn.Spawn.__code__

            def watch():   # (this frame innermost on the spawning thread: it is inside MPI's call)
                while True:
                    frame = sys._current_frames().get(spawning)
                    if frame is not None and frame.f_code is code:
                        os.kill(os.getpid(), signum)
                        return
                    time.sleep(0.005)

            threading.Thread(target=watch, daemon=True).start()
            return self._comm.Spawn(*args, **kwargs)

    def signalled(comm, *args, **kwargs):
        return spawn(SignalledInSpawn(comm), *args, **kwargs)

    changes.spawn_newcomers = signalled


def _made(path: str) -> bool:
    """Whether this process made the file ``path`` (False: another had)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _arguments():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.02, help="seconds each step (and each wait) lasts at least")
    p.add_argument("--discovery", help="the host discovery command (col.elastic.run's host_discovery)")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between runs of the discovery command")
    p.add_argument("--max-ranks", type=int)
    p.add_argument("--grow-to", type=int, default=0, help="after the last step, wait for this many ranks")
    p.add_argument("--wait-commits", type=int, default=1500, help="... for at most this many commits")
    p.add_argument("--kill", action="append", default=[], type=lambda s: tuple(map(int, s.split(":"))),
                   help="R:S: the rank launched as R dies at step S")
    p.add_argument("--die-spawning", type=int, help="the rank launched as this dies during the first spawn")
    p.add_argument("--notice-spawning", type=int, help="the rank launched as this gets a launcher's notice "
                   "(SIGUSR1) during the first spawn")
    p.add_argument("--notice-joined", action="store_true", help="each newcomer's supervisor gets a launcher's "
                   "notice (SIGUSR1) at the newcomer's first step")
    p.add_argument("--die-joining", help="the first newcomer to make this file ends before MPI starts")
    p.add_argument("--timing", action="store_true", help="print when growth starts and a newcomer's first step ends")
    p.add_argument("--out", help="rank 0 writes the final weights here (.npy)")
    p.add_argument("--log", help="rank 0 appends 'commit N' here after each commit that kept N ranks")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main())
