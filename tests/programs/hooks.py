"""Issue 37, item 4's scenarios for tests/test_hooks.py: what importing and using ``collectives``
installs in a process (``sys.excepthook``, exit handlers, SIGUSR1's handler) and when it goes, run
as users' programs: ``mpiexec -n N python -m tests.programs.hooks SCENARIO [ARG]``. Each look is
one line, ``rank R: LABEL: excepthook E, exit handlers +K, SIGUSR1 S``, against what the process had
before it imported ``collectives``. Nothing of ``collectives`` is imported at the top."""
import atexit
import importlib
import os
import signal
import sys
import time

from tests.programs.cues import await_file

RANK = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
_baseline: dict = {}
_exit_handlers: list = []   # registered after the baseline, and not unregistered


def _say(text: str) -> None:
    print(f"rank {RANK}: {text}", flush=True)


def _take_baseline() -> None:
    """What the process has before it imports ``collectives`` (after the probe's exit handler); from
    then on, count the exit handlers registered and not unregistered (atexit's own count of
    Python 3.11 does not go down when one is unregistered)."""
    _baseline.update(hook=sys.excepthook)
    register, unregister = atexit.register, atexit.unregister

    def counted_register(function, *args, **kwargs):
        _exit_handlers.append(function)
        return register(function, *args, **kwargs)

    def counted_unregister(function):
        _exit_handlers[:] = [f for f in _exit_handlers if f != function]   # (as atexit: every registration)
        unregister(function)

    atexit.register, atexit.unregister = counted_register, counted_unregister


def _look(label: str) -> None:
    hook = sys.excepthook
    hook_is = ("original" if hook is _baseline["hook"] else
               "the program's own" if getattr(hook, "programs_own", False) else "replaced")
    usr1 = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}.get(signal.getsignal(signal.SIGUSR1), "handled")
    _say(f"{label}: excepthook {hook_is}, exit handlers +{len(_exit_handlers)}, SIGUSR1 {usr1}")


def import_only() -> None:
    """MPI is running (the program imported mpi4py itself), then ``collectives`` (argv[2]:
    "collectives" or "collectives.torch") is imported and never called. Rank 0 ends its program
    only once the other rank's exit handlers have all run (its last one makes the file argv[3]). An
    exit handler registered before the import, so run after any that the import registered, says
    how long those took."""
    from mpi4py import MPI   # noqa: F401 - (started: an exit handler of collectives would find MPI running)
    if sys.argv[2] == "collectives.torch":
        import torch.distributed  # noqa: F401 - (torch's own exit handlers are not collectives')
    others_ended = sys.argv[3]

    def took():
        _say(f"exit handlers after the program's end took {time.monotonic() - ended:.3f} s")
        if RANK != "0":
            open(others_ended, "w").close()

    atexit.register(took)
    _take_baseline()
    importlib.import_module(sys.argv[2])
    _look("after import")
    if RANK == "0":
        await_file(others_ended, f"rank {RANK}", "the other rank's end")
    ended = time.monotonic()


def first_use() -> None:
    """The program uses the runtime (``rank()``, then a collective) and leaves it (argv[2]):
    "finalize": it calls MPI.Finalize() itself; "exit": its program ends; "foreign": it installs an
    excepthook of its own over the runtime's (as torch's init_process_group does), then ends. An
    exit handler registered first looks once the runtime's has run."""
    import numpy as np
    from mpi4py import MPI
    atexit.register(_look, "at exit")
    _take_baseline()
    import collectives as col
    _look("after import")
    col.rank()
    _look("after rank()")
    col.allreduce(np.ones(3))
    _look("after a collective")
    if sys.argv[2] == "finalize":
        MPI.Finalize()
        _look("after MPI.Finalize()")
    elif sys.argv[2] == "foreign":
        def programs_own(kind, value, traceback, wrapped=sys.excepthook):
            wrapped(kind, value, traceback)
        programs_own.programs_own = True
        sys.excepthook = programs_own


def torch_env() -> None:
    """No MASTER_ADDR, RANK or WORLD_SIZE: after ``import collectives.torch``, env:// (torch's
    default URL) and ring:// are the ring rendezvous: ring gets rank and size from MPI, and gloo,
    which needs a store, is refused by name."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)
    import torch.distributed as dist
    import collectives.torch  # noqa: F401 - registers "ring"
    _say(f"after import: MPI {'started' if _mpi_started() else 'not started'}")
    for backend, url in (("gloo", None), ("ring", None), ("ring", "ring://")):
        try:
            dist.init_process_group(backend, init_method=url)
            _say(f"{backend} {url}: rank {dist.get_rank()} of {dist.get_world_size()}")
            dist.destroy_process_group()
        except Exception as e:   # noqa: BLE001 - what the program gets is the point
            _say(f"{backend} {url}: {type(e).__name__}: {e}")


def _mpi_started() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized()


if __name__ == "__main__":
    {"import-only": import_only, "first-use": first_use, "torch-env": torch_env}[sys.argv[1]]()
