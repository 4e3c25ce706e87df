"""MPI's errors in this runtime's words (every module of the MPI transport reports them so)."""
from __future__ import annotations

from mpi4py import MPI


def error_text(error: MPI.Exception) -> str:
    """MPI's error in one line: its class, and the innermost cause from the library's error stack
    (MPICH's strings carry a stack of function names, one per line, that means nothing to users).

    >>> error_text(MPI.Exception(MPI.ERR_TRUNCATE))
    'Message truncated'
    """
    lines = [line.strip() for line in error.Get_error_string().strip().splitlines() if line.strip()]
    if not lines:
        return f"MPI error {error.Get_error_code()}"
    head = lines[0].split(", error stack:")[0].rstrip(",; ")
    cause = lines[-1].split("): ", 1)[-1].strip() if len(lines) > 1 else ""
    return f"{head} ({cause})" if cause and cause != head else head
