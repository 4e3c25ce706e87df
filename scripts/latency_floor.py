"""The floor under a small all-reduce at n=2: what the express lane must do, written as one flat loop
in mpi4py, beside the lane itself and MPI's own ``Allreduce``, in one launch (8 bytes of float32).

    mpiexec -bind-to core -n 2 python scripts/latency_floor.py

Rank 0 prints microseconds per call, the median of 5 rounds of 20000 calls, for:

- ``exchange``: a bare persistent exchange (each request started, then tested until done) of the lane's
  message, a 264-byte header and the payload, with the other rank;
- ``look``: the test of the control channel's posted receive with which every call looks for a rank
  that gave up;
- ``floor``: everything the lane must do, flat: a deadline read, the signature padded and written
  into the message, the payload copied in, the exchange, the peer's signature compared, the sum,
  the look, a second deadline read;
- ``flat``: the lane's own work with the lane's own objects (its lookup, the engine's turn, the call
  renewed, the floating-point guard, the transport's persistent requests, the give-up look) in one
  function instead of six frames (``Lane.run``, ``_in_turn``, ``move``, ``Prepared.run``,
  ``exchange``, ``_wait_all``); a measure of what flattening would gain, not a replacement: its wait
  has no bound and it skips the lane's error handling;
- ``lane``: ``col.allreduce(x, out=o)``; ``mpi``: ``comm.Allreduce(x, o)``.

What ``lane`` takes above ``floor`` is the lane's structure (frames, lookups, the engine's turn, the
floating-point guard): docs/performance.md counts it.
"""
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives as col
from collectives.ops import express
from collectives.process import startup
from ring import arrays

CALLS, ROUNDS = 20000, 5
HEADER = 264   # (ring.doubling's: a 256-byte signature, the "all agree" byte, padding to 8)


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        raise SystemExit("latency_floor.py: run it with mpiexec -n 2")
    peer = 1 - rank
    x, o = np.ones(2, np.float32), np.empty(2, np.float32)
    send, recv = np.zeros(HEADER + x.nbytes, np.uint8), np.zeros(HEADER + x.nbytes, np.uint8)
    requests = [comm.Recv_init([recv, MPI.BYTE], peer, 7), comm.Send_init([send, MPI.BYTE], peer, 7)]
    send_check, recv_check = memoryview(send)[:257], memoryview(recv)[:257]
    own, theirs = send[HEADER:].view(np.float32), recv[HEADER:].view(np.float32)
    add, clock = np.add, time.monotonic
    control = comm.Recv_init([np.zeros(512, np.uint8), MPI.BYTE], MPI.ANY_SOURCE, 99)   # (never matched)
    control.Start()
    look = control.Test
    template = b"allreduce|sum|float32|(2,)|%d"

    def exchanged(pair):   # (as the transport's ready exchange: started and tested one by one)
        receiving, sending = pair
        receiving.Start()
        sending.Start()
        while not (receiving.Test() and sending.Test()):
            pass

    def exchange():
        for _ in range(CALLS):
            exchanged(requests)

    def looks():
        for _ in range(CALLS):
            look()

    def floor():
        for seq in range(CALLS):
            deadline = clock() + 30.0
            header = (template % seq).ljust(256, b"\0") + b"\1"
            send_check[:] = header
            own[...] = x
            exchanged(requests)
            deadline = clock() + 30.0
            if recv_check.tobytes() != header:
                raise SystemExit("the ranks' signatures differ")
            add(own, theirs, out=o)
            look()
        return deadline

    col.allreduce(x, out=o)   # (the first call sets the lane up; the second makes its exchange ready)
    col.allreduce(x, out=o)
    world, guard, unguard = startup.the_world, arrays.ieee_floating_point, arrays.restore_floating_point
    wired = express.allreduce_lane(world, x, "sum", o).exchange   # (the one step's, on two ranks)
    ready, lane_requests = wired.func.__self__, wired.args[0].__self__.requests   # (run_wired, Persistent.run)

    def flat():
        for _ in range(CALLS):
            lane = express.allreduce_lane(world, x, "sum", o)
            engine = lane.group.runtime.engine
            if not engine.idle():
                raise SystemExit("latency_floor.py: the engine's turn was taken")
            try:
                engine.take()
                call, prepared = lane.call, ready
                quiet = guard()
                try:
                    seq = call.renew()
                    header = (lane.template % seq).ljust(256, b"\0") + b"\1"
                    prepared.send_check[:] = header
                    prepared.own[...] = x
                    exchanged(lane_requests)
                    call.progressed()
                    if prepared.recv_check.tobytes() != header:
                        raise SystemExit("the ranks' signatures differ")
                    add(prepared.own, prepared.received, out=o)
                    lane.transport.control.check_gave_up(seq)
                finally:
                    unguard(quiet)
                call.in_step = True
            finally:
                engine.end_turn()

    def lane():
        for _ in range(CALLS):
            col.allreduce(x, out=o)

    def mpi():
        for _ in range(CALLS):
            comm.Allreduce(x, o)

    loops = {"exchange": exchange, "look": looks, "floor": floor, "flat": flat, "lane": lane, "mpi": mpi}
    times: dict[str, list[float]] = {name: [] for name in loops}
    for name, loop in loops.items():   # (a warm-up each: the lane is set up by its first call)
        loop()
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            comm.Barrier()
            started = time.perf_counter()
            loop()
            times[name].append((time.perf_counter() - started) / CALLS * 1e6)
    control.Cancel()
    control.Wait()
    if rank == 0:
        for name, measured in times.items():
            print(f"{name:9s} {statistics.median(measured):6.2f} us per call (median of {ROUNDS} rounds of {CALLS})")


if __name__ == "__main__":
    main()
