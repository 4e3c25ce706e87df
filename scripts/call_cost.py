"""Where the time of one small call goes, at any n: what it runs, counted (the Python functions by
layer, the MPI calls it makes, its polls, yields, naps and thread hand-offs), and what its parts
take, timed side by side in one launch (the call, the same call on a group of one rank, the bare
MPI message it needs, MPI's own collective).

    mpiexec -bind-to core -n 2 python scripts/call_cost.py            # 8 bytes: allreduce, allgather, broadcast
    mpiexec -bind-to core -n 2 python scripts/call_cost.py --bytes 4096 --no-times

Rank 0 prints two markdown tables (docs/performance.md has them). The counts are per call, over
2000 calls under cProfile (C functions such as numpy's ufuncs and mpi4py's methods are not
Python frames: the MPI calls are counted by wrappers, the rest not at all), then the bytecode
instructions each layer runs, over 200 calls under ``sys.settrace``. At n=2 the polls
depend on how long the peer takes, so they vary a little from launch to launch; the rest is exact.
The times are medians of 7 interleaved rounds: "frame" is the same call on a one-rank group (no
message: the runtime's Python alone), "wire" a persistent exchange of the same message with the
peer in bare mpi4py (recursive doubling's steps, at n=2 one exchange), "rest" what the call
takes beyond the two (the ranks waiting for each other, the polls).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from mpi4py import MPI

import collectives as col
from ring import doubling
from ring.transport.mpi import transport as mpi_transport

ROOT = Path(col.__file__).resolve().parent.parent   # (the checkout whose calls are counted)
CALLS, ROUNDS = 2000, 7
#: Python functions by layer: (what it does, the files, under the repository).
LAYERS = (
    ("module function and Group method", ("collectives/api.py", "collectives/groups/")),
    ("frame: engine turn, call, errors", ("collectives/calls/call.py", "collectives/calls/progress.py",
                                          "collectives/process/")),
    ("argument checks", ("collectives/calls/validate.py",)),
    ("cross-rank check: signature", ("collectives/calls/signature.py",)),
    ("body (its checks, algorithm choice), or the express lane", ("collectives/ops/",)),
    ("algorithm: recursive doubling", ("ring/algorithms.py", "ring/doubling.py", "ring/execute.py",
                                       "ring/arrays.py")),
    ("transport: exchange, wait, control", ("ring/transport/",)),
)
mpi_calls: Counter = Counter()


def counted(name: str, fn):
    """``fn`` (an mpi4py call), counted under ``name`` in ``mpi_calls``."""
    def call(*args, **kwargs):
        mpi_calls[name] += 1
        return fn(*args, **kwargs)
    return call


class CountedPrequest(MPI.Prequest):
    """A persistent request whose starts and tests are counted in ``mpi_calls``."""

    def Start(self) -> None:
        mpi_calls["Start"] += 1
        super().Start()

    def Test(self, status=None) -> bool:
        mpi_calls["Test (a poll, or the look for a give-up)"] += 1
        return super().Test(status)


class CountedComm:
    """A communicator whose method calls are counted in ``mpi_calls`` (the transport's own is kept),
    and the persistent requests it makes, each start and test."""

    def __init__(self, comm: MPI.Comm):
        self._comm = comm

    def __getattr__(self, name: str):
        made = counted(name, getattr(self._comm, name))
        if name.endswith("_init"):
            return lambda *args, **kwargs: CountedPrequest(made(*args, **kwargs))
        return made


def count_mpi(group) -> None:
    """Count the MPI calls of ``group``'s transport and its control plane from now on."""
    t = group.transport
    t.comm, t.control.comm = CountedComm(t.comm), CountedComm(t.control.comm)
    if t.control._incoming is not None:   # (posted as the transport was made, where every rank is on this host)
        t.control._incoming = CountedPrequest(t.control._incoming)
    mpi_transport._testall = counted("Testall (a poll)", MPI.Request.Testall)


WAITING = "waiting past the quick polls (grows with the wait)"
FIXED = "the runtime's Python functions, but the waiting"
BYTECODES = "bytecode instructions the runtime's Python runs, all layers"


def layer_of(filename: str, name: str) -> str:
    """The layer (LAYERS) of a Python function, or WAITING for what a wait runs once its quick polls
    have not finished it (``ring.transport.mpi.waiting``: its pauses, its looks at the clock and the
    control plane); "" for C functions and others' files."""
    path = filename.replace(str(ROOT) + "/", "")
    if path.startswith("ring/transport/") and name not in _EVERY_CALL:
        return WAITING
    return next((what for what, places in LAYERS if path.startswith(places)), "")


#: The transport's functions that a small call runs whatever the wait (the exchange, its quick polls,
#: the deadline moved on, the look for a rank that gave the call up).
_EVERY_CALL = ("exchange", "_persist", "_exchange_once", "_exchange_again", "_wait_all", "progressed",
               "check_gave_up", "run")   # ("run": Persistent.run, the ready exchange)


def counts(fn) -> dict[str, float]:
    """Per call of ``fn``: the Python functions of each layer, every C function, the MPI calls, and
    the named waits (yields, naps, thread hand-offs)."""
    for _ in range(200):
        fn()
    mpi_calls.clear()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        fn()
    profile.disable()
    found: Counter = Counter()
    for (filename, _, name), (_, ncalls, *_rest) in pstats.Stats(profile).stats.items():
        if filename == __file__:
            continue   # (the counting wrappers: not the runtime's)
        layer = layer_of(filename, name)
        if filename == "~":
            found["C functions called from Python"] += ncalls
            found["yields (sched_yield)"] += ncalls if "sched_yield" in name else 0
            found["naps (time.sleep)"] += ncalls if name.endswith("sleep>") else 0
            continue
        if filename.endswith("threading.py"):   # (a wait's look at the runtime's stop, or a hand-off)
            handing = name in ("wait", "notify", "notify_all")
            found["thread hand-offs (threading waits, notifies)"] += ncalls if handing else 0
            layer = layer or (WAITING if name == "is_set" else "")
        found[layer or "others' Python functions (numpy, threading)"] += ncalls
        found["Python functions, all layers"] += ncalls
    found[FIXED] = sum(found[what] for what, _ in LAYERS)
    found["MPI calls"] = sum(mpi_calls.values())
    for name, n in mpi_calls.items():
        found[f"  MPI: {name}"] = n
    return {k: v / CALLS for k, v in found.items()}


def bytecodes(fn, calls: int = 200) -> dict[str, float]:
    """Per call of ``fn``: the bytecode instructions the runtime's Python runs, all layers and each
    (``sys.settrace``'s opcode events: what the interpreter does, which frames count only once)."""
    found: Counter = Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        if event == "opcode":
            layer = layer_of(frame.f_code.co_filename, frame.f_code.co_name)
            if layer:
                found[f"bytecodes: {layer}"] += 1
                found[BYTECODES] += 1
        return trace

    for _ in range(20):
        fn()
    sys.settrace(trace)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.settrace(None)
    return {k: v / calls for k, v in found.items()}


def per_call(loop, comm: MPI.Comm, calls: int = 2000) -> float:
    comm.Barrier()
    started = time.perf_counter()
    loop(calls)
    return (time.perf_counter() - started) / calls * 1e6


def wire_loop(comm: MPI.Comm, nbytes: int):
    """A persistent exchange of a doubling message of ``nbytes`` of payload with each peer of
    recursive doubling in turn, polled as the transport polls: the message alone."""
    size, rank = comm.Get_size(), comm.Get_rank()
    message = doubling.SIGNATURE_BYTES + 8 + nbytes
    send, recv = np.zeros(message, np.uint8), np.zeros(message, np.uint8)
    steps = []
    for step in doubling.doubling_steps(rank, size):
        requests = []
        if step.recv_from is not None:
            requests.append(comm.Recv_init([recv, MPI.BYTE], step.recv_from, 5))
        if step.send_to is not None:
            requests.append(comm.Send_init([send, MPI.BYTE], step.send_to, 5))
        steps.append(requests)

    def loop(calls: int) -> None:
        for _ in range(calls):
            for requests in steps:
                for request in requests:
                    request.Start()
                while not all([request.Test() for request in requests]):
                    pass
    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=8, help="bytes per rank (the all-gather's: each rank's rows)")
    parser.add_argument("--no-times", action="store_true", help="the counts only")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    n, me = comm.Get_size(), comm.Get_rank()
    col.init()
    alone = col.split(me)   # (a group of this rank alone: the frame without a message)
    x, out = np.ones(args.bytes // 4, np.float32), np.empty(args.bytes // 4, np.float32)
    world = None   # (the module functions' own world, as a program calls them)
    gathered = {True: np.empty(n * x.size, np.float32), False: np.empty(x.size, np.float32)}   # (by g is world)
    cases = {   # collective: (ours on a group, MPI's own, the payload of its doubling message)
        "allreduce": (lambda g: col.allreduce(x, out=out, group=g), lambda: comm.Allreduce(x, out), x.nbytes),
        "allgather": (lambda g: col.allgather(x, out=gathered[g is world], group=g),
                      lambda: comm.Allgather(x, gathered[True]), n * (16 + x.nbytes)),
        "broadcast": (lambda g: col.broadcast(out, group=g), lambda: comm.Bcast(out), x.nbytes),
    }
    count_mpi(col.world_group())
    table = {name: {**counts(lambda: ours(world)), **bytecodes(lambda: ours(world))} for name, (ours, *_) in cases.items()}
    rows = sorted({k for found in table.values() for k in found}, key=_order)
    if me == 0:
        print(f"# mpiexec -n {n} python scripts/call_cost.py --bytes {args.bytes}: per call, counted")
        print(f"| per {args.bytes}-byte call, n={n} | " + " | ".join(cases) + " |")
        print("|---|" + "---|" * len(cases))
        for row in rows:
            print(f"| {row} | " + " | ".join(f"{table[c].get(row, 0):.3g}" for c in cases) + " |")
    if args.no_times:
        return
    wires = {name: wire_loop(comm, payload) for name, (_, _, payload) in cases.items()}
    times = {name: {"ours": [], "frame": [], "wire": [], "MPI": []} for name in cases}
    for _ in range(ROUNDS):
        for name, (ours, mpis, _) in cases.items():
            timed = times[name]
            timed["ours"].append(per_call(lambda k: [ours(world) for _ in range(k)], comm))
            timed["frame"].append(per_call(lambda k: [ours(alone) for _ in range(k)], comm))
            timed["wire"].append(per_call(wires[name], comm))
            timed["MPI"].append(per_call(lambda k: [mpis() for _ in range(k)], comm))
    if me == 0:
        print(f"\n# the same calls timed, us per call (medians of {ROUNDS} rounds, interleaved; "
              f"load {os.getloadavg()[0]:.1f})")
        print("| collective | ours | frame (1 rank) | wire (bare) | rest | MPI's | ours / MPI's |")
        print("|---|---|---|---|---|---|---|")
        for name, timed in times.items():
            m = {k: statistics.median(v) for k, v in timed.items()}
            ratio = statistics.median(o / p for o, p in zip(timed["ours"], timed["MPI"]))
            print(f"| {name} | {m['ours']:.2f} | {m['frame']:.2f} | {m['wire']:.2f} | "
                  f"{m['ours'] - m['frame'] - m['wire']:.2f} | {m['MPI']:.2f} | {ratio:.2f} |")


def _order(row: str) -> tuple:
    layers = [what for what, _ in LAYERS] + [WAITING, "others' Python functions (numpy, threading)"]
    first = ["Python functions, all layers", FIXED]
    if row.startswith("bytecodes: ") or row == BYTECODES:   # (last, by layer as the functions are)
        return (3, -1) if row == BYTECODES else (3, layers.index(row[len("bytecodes: "):]))
    return (0, first.index(row)) if row in first else (1, layers.index(row)) if row in layers else \
        (2, 0 if not row.startswith("  ") else 1, row)


if __name__ == "__main__":
    main()
