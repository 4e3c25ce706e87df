"""A two-rank all-gather or broadcast as the bench times it (each call after a barrier, the caller's
own work between calls: the output reset, the result checked), side by side in one launch: ours
(``col.allgather(x, out=out)``, ``col.broadcast(x)``), MPI's own (``Allgather``, ``Bcast``), and the
floors of ours: flat loops of the same messages in mpi4py, over persistent requests polled with
``Test``, which no Python frame of the runtime adds to. Rank 0 prints the median microseconds of
each per size (the slowest rank's time per call).

* ``floor``: the check's exchange of 264 bytes, then the data straight between the arrays (the
  messages of the runtime's direct lanes);
* ``one-way`` (broadcast): the least a checked broadcast could send. The two headers cross while
  the root's bytes wait in a synchronous send, which the other rank receives only once the headers
  agree, so the send's completion tells the root they did: no message comes back after the data.

      mpiexec -bind-to core -n 2 python scripts/direct_floor.py                      # 4 KiB .. 512 KiB a rank
      mpiexec -bind-to core -n 2 python scripts/direct_floor.py --sizes 131072 --calls 600
      mpiexec -bind-to core -n 2 python scripts/direct_floor.py --op broadcast --sizes 65536 262144 1048576

What it measured (docs/performance.md): the all-gather at 128 KiB a rank ("The round of
2026-11-30, night"): ours 24.1-24.8 us while the runtime's direct lane ran in five frames, 21.2-21.5
in one function; MPI's 20.3-21.2; the floor 14.8-15.0. The broadcast ("The round of 2026-12-01,
evening"): even the one-way floor takes longer than MPI's ``Bcast``, which sends the same bytes the
same way with no header. Run it from each checkout in turn (``PYTHONPATH=<checkout>``).
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives as col


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=list(WAYS), default="allgather")
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 32768, 131072, 524288], help="bytes a rank")
    p.add_argument("--calls", type=int, default=300, help="timed calls of each way per size")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("direct_floor.py: run it on two ranks (mpiexec -n 2)")
    comm = world.Dup()   # (the floors' messages apart from MPI's own collective and the runtime's)
    for nbytes in args.sizes:
        ways, reset, result, expected = WAYS[args.op](world, comm, nbytes // 4)
        times = _medians(world, ways, reset, result, expected, args.calls)
        if world.rank == 0:
            print(f"{nbytes:>9} B a rank, {args.op}: " + "  ".join(f"{name} {t:7.1f} us" for name, t in times.items()),
                  flush=True)
    comm.Free()


def _allgather(world: MPI.Comm, comm: MPI.Comm, count: int) -> tuple:
    """The all-gather's ways (each rank brings ``count`` elements: its rank + 1), how to reset the
    output, the output and what it should hold."""
    rank, peer = world.rank, 1 - world.rank
    x, out = np.full(count, rank + 1, np.float32), np.empty(2 * count, np.float32)
    mine, theirs = (out[:count], out[count:]) if rank == 0 else (out[count:], out[:count])
    check, headers = _check(comm, peer)
    rows = [comm.Recv_init(theirs, peer, 9), comm.Send_init(x, peer, 9)]

    def floor() -> None:
        _run(check)
        _run(rows, before_the_wait=lambda: mine.__setitem__(Ellipsis, x))

    ways = {"ours": lambda: col.allgather(x, out=out), "MPI": lambda: world.Allgather(x, out), "floor": floor}
    return ways, lambda: out.fill(-1), out, np.repeat(np.float32([1, 2]), count)


def _broadcast(world: MPI.Comm, comm: MPI.Comm, count: int) -> tuple:
    """The broadcast's ways, from rank 0: its ``count`` elements (1) into rank 1's (reset to -1); the
    rest as :func:`_allgather`'s."""
    rank, peer = world.rank, 1 - world.rank
    x = np.full(count, 1 if rank == 0 else -1, np.float32)
    check, headers = _check(comm, peer)
    data = [comm.Send_init(x, 1, 9) if rank == 0 else comm.Recv_init(x, 0, 9)]
    synchronous = comm.Ssend_init(x, 1, 10) if rank == 0 else comm.Recv_init(x, 0, 10)

    def floor() -> None:
        _run(check)
        _run(data)

    def one_way() -> None:
        for request in check:
            request.Start()
        if rank == 0:
            synchronous.Start()
            _poll(check + [synchronous])
            return
        _poll(check[:1])
        if headers[0].tobytes() != headers[1].tobytes():
            raise SystemExit("direct_floor.py: the headers differ")
        _run([synchronous])
        _poll(check[1:])

    ways = {"ours": lambda: col.broadcast(x), "MPI": lambda: world.Bcast(x), "floor": floor, "one-way": one_way}
    return ways, lambda: x.fill(1 if rank == 0 else -1), x, np.ones(count, np.float32)


WAYS = {"allgather": _allgather, "broadcast": _broadcast}


def _check(comm: MPI.Comm, peer: int) -> tuple[list, tuple]:
    """The check's exchange of 264-byte headers with ``peer`` (the receive first), and the two headers."""
    header, header_in = np.zeros(264, np.uint8), np.zeros(264, np.uint8)
    return [comm.Recv_init(header_in, peer, 8), comm.Send_init(header, peer, 8)], (header_in, header)


def _run(requests: list, before_the_wait=None) -> None:
    for request in requests:
        request.Start()
    if before_the_wait is not None:
        before_the_wait()
    _poll(requests)


def _poll(requests: list) -> None:
    while not all(request.Test() for request in requests):
        pass


def _medians(world: MPI.Comm, ways: dict, reset, result: np.ndarray, expected: np.ndarray, calls: int,
             rounds: int = 5) -> dict:
    """Each way's median microseconds per call (the slowest rank's), timed as the bench times: ``reset()``
    before each call, ``result`` compared with ``expected`` after it; the ways take turns, ``rounds``
    times, so that a launch's slow spell weighs on each alike."""
    for _ in range(5):
        ways["ours"]()   # (the lane opens and makes its exchange ready)
    seconds = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            for i in range(calls // rounds + 4):   # (as bench.timing: the output reset, a one-integer
                reset()                            # all-reduce for a barrier, the call, the wrong elements counted)
                world.Allreduce(np.zeros(1, np.int32), np.zeros(1, np.int32), op=MPI.MAX)
                began = time.perf_counter()
                way()
                if i >= 4:
                    seconds[name].append(time.perf_counter() - began)
                if np.count_nonzero(result != expected):
                    raise SystemExit(f"direct_floor.py: {name} gave the wrong result")
    medians = {}
    for name, taken in seconds.items():
        slowest = np.array(taken)
        world.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        medians[name] = float(np.median(slowest)) * 1e6
    return medians


if __name__ == "__main__":
    main()
