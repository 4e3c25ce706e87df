"""For command-line programs built on collectives (``python -m trainer``, ``python -m bench``):
usage errors said once, by rank 0, while every rank exits with the same status.

>>> parser = ArgumentParser(prog="python -m mytool")     # doctest: +SKIP
>>> parser.add_argument("--lr", type=finite_positive)     # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import collectives as col
from collectives.about import VERSION, launched_rank, launcher
USAGE = 2   # exit status of a usage error, as argparse's
FAULT = 1   # exit status of a fault (a file that cannot be written, a failed collective)
INTERRUPTED = 130   # exit status after Ctrl-C (128 + SIGINT, as a shell reports it)
PREEMPTED = 143   # exit status after SIGTERM once every rank stopped (128 + SIGTERM): a batch script requeues on it


class _DefaultsInHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default once: not after a help text that already says it, "none" for None,
    and nothing for switches (``store_true``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or action.nargs == 0:
            return text
        if action.default is None:
            return text + " (default: none)"
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with errors printed by rank 0 alone (every rank exits with status 2),
    no abbreviated flags (``--epoch`` is not ``--epochs``), each flag's default in its help, and
    ``--version``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _DefaultsInHelp)
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s (ringcollectives {VERSION})")

    def error(self, message: str):
        if speaks():
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(USAGE)


def speaks() -> bool:
    """Whether this process says what every rank of the program would say alike (a usage error): rank 0
    of the world once MPI runs, else the launcher's rank 0, or a process no launcher started (asking
    MPI would start it, and a usage error must not wait for that)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return col.rank() == 0
    return launched_rank() in (None, 0)



def launch_note(command: str) -> str | None:
    """What to tell a user whose world has one rank (None when it has more, or was asked for):
    the program was started without a launcher, or by a launcher of another MPI than the one
    mpi4py uses, which then runs N separate worlds of one rank each.

    >>> launch_note("python -m trainer")                 # doctest: +SKIP
    'running 1 rank: no MPI launcher started this process (mpirun -n 4 python -m trainer runs 4)'
    """
    if col.size() != 1:
        return None
    started = launcher()
    if started is None:
        return f"running 1 rank: no MPI launcher started this process (mpirun -n 4 {command} runs 4)"
    name, variable, value = started
    if name.startswith("Slurm's srun"):
        return None   # (the runtime refuses a lone srun task itself, naming the --mpi to use)
    if value.isdigit() and int(value) > 1:
        return (f"running 1 rank, but {name} started {value} ({variable}={value}): mpi4py uses another MPI "
                f"than that launcher's, so each process is a world of its own; use the mpiexec of mpi4py's MPI "
                f"(with the 'mpich' extra: {os.path.join(os.path.dirname(sys.executable), 'mpiexec')})")
    return None   # one rank, as asked


def finite_positive(text: str) -> float:
    """A float > 0 that is finite (argparse type): 'nan' and 'inf' are refused."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def finite_non_negative(text: str) -> float:
    """A float >= 0 that is finite (argparse type)."""
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value
