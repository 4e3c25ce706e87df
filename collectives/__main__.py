"""``python -m collectives``: what this installation is and whether it works here, as ``ompi_info``
and ``horovodrun --check-build`` tell. Run it as the job will run::

    mpiexec -n 4 python -m collectives

Rank 0 prints the versions, the MPI library and the launcher, the ranks on each host, every
setting with where it came from, the optional packages and the GPU; then every rank runs a
self-check of well under a second: each collective (each all-reduce algorithm forced in turn) and a
ring of point-to-point messages on rank-dependent integers, compared with mpi4py's own results.
Exit status 0 when every result matched, 1 otherwise (each wrong one is named); 2 for an argument
it does not take (it takes none but ``--help``), refused before MPI starts.
"""
from __future__ import annotations

import argparse
import socket
import sys
import time

import numpy as np

import collectives as col
from collectives import about
from collectives.process import ending, rendezvous

# (mpi4py's MPI is imported inside the functions: importing it starts MPI, which --help and a
# refused argument must not wait for)

SIZES = (3, 1 << 17)   # elements: the latency path and the bandwidth path


_HELP = """\
What this installation is and whether it works here, as ompi_info and horovodrun --check-build tell:
rank 0 prints the versions, the MPI library and the launcher, the ranks on each host, every setting
and where it came from, the optional packages and the GPU; then every rank runs a self-check of
each collective and of point-to-point messages against mpi4py's own results.
Exit status: 0 when every result matched, 1 when one did not (each is named), 2 for an argument."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, speaking from rank 0 alone (the launcher's numbering: MPI has not started),
    an error in one line."""

    def print_help(self, file=None) -> None:
        if about.launched_rank() in (None, 0):
            super().print_help(file)

    def error(self, message: str):
        if about.launched_rank() in (None, 0):
            print(f"{self.prog}: error: {message} (it takes none but --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, read before MPI starts. It takes no arguments: ``--help`` prints what the
    command does, anything else is refused (exit status 2, as argparse's).

    >>> parse_args([])
    Namespace()
    """
    parser = _Parser(prog="python -m collectives", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                     description=_HELP, epilog="Run it as the job will run:  mpiexec -n 4 python -m collectives")
    return parser.parse_args(argv)


def describe() -> list[str]:
    """The report's lines (every rank takes part: the hosts are gathered)."""
    from mpi4py import MPI
    hosts = MPI.COMM_WORLD.allgather(socket.gethostname())
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    started, job = about.launcher(), about.slurm_job()
    how = f"{started[0]} ({started[1]}={started[2]})" if started else "no launcher (a world of one rank)"
    how += f" in {job}" if job else ""
    how += f", MPI's world formed through the runtime's PMI server at {rendezvous.server_address}" \
        if rendezvous.server_address else ""
    lines = [about.versions(), f"MPI: {about.mpi_library()}",
             f"launched by {how}: {col.size()} rank(s) on {len(by_host)} host(s): "
             + "; ".join(f"{host} ranks {', '.join(map(str, ranks))}" for host, ranks in by_host.items()),
             "settings (environment, or init() keywords; col.settings()):"]
    rows = about.settings_table(col.settings())
    width = max(len(variable) for variable, _, _ in rows)
    lines += [f"  {variable:<{width}}  {value:<34} {source}" for variable, value, source in rows]
    lines += ["optional packages:"] + [f"  {line}" for line in about.extras()]
    lines.append(f"GPU of rank 0: {about.gpu(col.local_rank())}")
    return lines


def expected_and_ours(count: int) -> list[tuple[str, object, object]]:
    """(what, mpi4py's result, ours) for every collective on ``count`` rank-dependent integers."""
    from mpi4py import MPI
    comm, r, n = MPI.COMM_WORLD, col.rank(), col.size()

    def mine(rank: int) -> np.ndarray:
        return (np.arange(count, dtype=np.int64) * (rank + 1) + rank) % 1000
    x, whole = mine(r), np.empty(count * n, np.int64)
    comm.Allgather(mine(r), whole)
    total, (start, stop) = whole.reshape(n, count).sum(0), col.block_bounds(count)[r]
    forced = ("doubling", "halving", "ring") if x.nbytes <= col.settings().small_bytes else ("halving", "ring")
    results = [(f"allreduce ({name or 'auto'})", total, col.allreduce(x, algorithm=name, name="self-check"))
               for name in (None, *forced)]
    results += [("reduce_scatter", total[start:stop], col.reduce_scatter(x)),
                ("allgather", whole, col.allgather(x)),
                ("broadcast", mine(0), col.broadcast(x.copy(), root=0)),
                ("reduce", total if r == n - 1 else None, col.reduce(x, root=n - 1)),
                ("gather", whole if r == 0 else None, col.gather(x, root=0)),
                ("scatter", whole[slice(*col.block_bounds(count * n)[r])],
                 col.scatter(whole if r == 0 else None, root=0))]
    swapped = np.empty_like(whole)
    comm.Alltoall(whole, swapped)
    results.append(("alltoall", swapped, col.alltoall(whole)))
    received = np.empty(count, np.int64)
    col.wait_all([col.isend(x, (r + 1) % n), col.irecv(received, (r - 1) % n)])
    results.append(("send/recv around the ring", mine((r - 1) % n), received))
    col.barrier()
    return results


def self_check() -> tuple[int, list[str]]:
    """How many results this rank compared, and which differed from MPI's ("what at N elements")."""
    compared, wrong = 0, []
    for count in SIZES:
        for what, expected, ours in expected_and_ours(count):
            compared += 1
            if expected is None and ours is None:   # (a rooted collective, off its root)
                continue
            if expected is None or ours is None or not np.array_equal(np.asarray(ours), expected):
                wrong.append(f"{what} at {count} elements: not MPI's result")
    return compared, wrong


def main(argv: list[str] | None = None) -> int:
    """``python -m collectives [--help]``: the report and the self-check; the exit status (0: every
    result matched)."""
    parse_args(argv)
    try:
        col.init()   # (the runtime starts MPI, once the command line is known good: under torchrun it forms the world)
        lines = describe()
    except (col.CollectiveError, col.CollectiveUsageError) as e:   # the runtime could not be set up: say why
        ending.print_line(f"[rank {about.launched_rank() or 0}] python -m collectives: {e}")
        return 1
    from mpi4py import MPI
    if col.rank() == 0:
        print("\n".join(lines), flush=True)
    began = time.perf_counter()
    try:
        compared, wrong = self_check()
    except (col.CollectiveError, col.CollectiveUsageError) as e:   # raised alike on every rank
        print(f"[rank {col.rank()}] self-check failed: {e}", file=sys.stderr, flush=True)
        return 1
    every = MPI.COMM_WORLD.gather(wrong, root=0)
    if col.rank() == 0:
        failures = [f"rank {r}: {w}" for r, found in enumerate(every) for w in found]
        verdict = "every result equal to MPI's" if not failures else f"{len(failures)} wrong:\n  " + \
            "\n  ".join(failures)
        print(f"self-check: {compared} calls on {col.size()} rank(s) in {time.perf_counter() - began:.2f} s, "
              f"{verdict}", flush=True)
    return 1 if MPI.COMM_WORLD.allreduce(len(wrong)) else 0


if __name__ == "__main__":
    sys.exit(main())
