"""Tier 2: a call issued inside a done-callback is signed (``collectives.calls.signature``) with the
name of the thread that registered the callback, whichever thread runs it on each rank: the one
that finished the async call (the engine's), or the registrant where the call was done already.
The ranks then agree on it, as the callback's docstring promises ("runs at once there, right after
this one on every rank"). Runs at every world size."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def test_a_callbacks_call_agrees_whichever_thread_runs_it_on_each_rank():
    results, trials = [], 4
    for trial in range(trials):
        x = np.full(3, RANK + 1.0 + trial)
        if RANK == 0:
            time.sleep(0.05)   # (the others' calls wait for this rank: their engine threads finish them)
        work = col.allreduce(x, async_op=True)
        if RANK == 0:
            work.wait()        # done: its callback runs at once, here, in the main thread
        else:
            time.sleep(0.01)   # (past the pickup time: the engine thread runs the call, and its callback)
        work.add_done_callback(lambda w, t=trial: results.append(col.allreduce(np.full(2, RANK + 1.0 + t))))
        work.wait()
    col.barrier(timeout=60)   # (every callback has run: the engine thread ran them before its calls ended)
    expected = [np.full(2, sum(r + 1.0 + t for r in range(N))) for t in range(trials)]
    assert len(results) == trials, f"{trials - len(results)} callback call(s) raised (their RuntimeWarnings say why)"
    assert all(np.array_equal(got, want) for got, want in zip(results, expected)), results
