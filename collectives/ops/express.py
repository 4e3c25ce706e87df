"""The express lane: a small blocking all-reduce of a host array, as a program repeats it (a
training loop's loss, a metric, a few KiB of gradients), in one frame instead of five layers.

The first call of each kind (group, dtype, shape, op) takes the usual way (``collectives.calls.call``,
``bodies.allreduce``) and, where the runtime would run it by recursive doubling, sets up a
:class:`Lane` for the calls that follow: its checks made once, its signature template, its
``Call`` (the bound of its waits) kept and renumbered. A later call of that kind with no options
(``timeout=``, ``name=``, ``algorithm=``, ``compression=``, ``async_op=``) from the main thread
then runs the lane: the same engine turn, the same message (the signature riding on the data:
``ring.doubling``), the same bounded wait and the same errors, only fewer Python frames (13 instead
of 18 at n=2, ``scripts/call_cost.py``). Anything else, or a lane that no longer fits (the
settings changed, a timeline records), takes the usual way.

    >>> x = np.ones(2, np.float32)                                                   # doctest: +SKIP
    >>> col.allreduce(x)            # sets the lane up                               # doctest: +SKIP
    >>> col.allreduce(x)            # runs it                                        # doctest: +SKIP
"""
from __future__ import annotations

import copy
from threading import get_ident
from typing import Any

import numpy as np

from collectives.calls import progress, timeline
from collectives.calls.call import Call, ended, stopped
from collectives.calls.group_protocol import CallGroup
from ring import algorithms, arrays, doubling, execute

_MOST_LANES = 64   # kinds of call kept per runtime (a program that keeps making new shapes does not grow it)


class Lane:
    """What every call of one kind shares: the group, the array's ``dtype`` and ``shape``, the op
    and its ufunc, the signature template, the reused ``call``, whether its arithmetic is floating
    point, and its exchange made ready (``ring.doubling.Prepared``, in the main thread's buffers, at
    its first run; "avg" takes ``algorithms.allreduce_small``, which scales)."""

    __slots__ = ("group", "transport", "dtype", "shape", "op", "combine", "template", "call", "floating", "ready")

    def __init__(self, group: CallGroup, x: np.ndarray, op: str, template: bytes, call: Call):
        self.group, self.dtype, self.shape, self.op, self.template = group, x.dtype, x.shape, op, template
        self.transport = group.transport   # (a group's, for its whole life)
        self.combine = arrays.ufunc(np, op) if op != "avg" else None
        self.call = call
        self.floating = x.dtype.kind in "fc"
        self.ready: doubling.Prepared | None = None

    def run(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """One call: the engine's turn taken at once where it is free (else in its place, as
        ``run_now`` gives it), then what ``_frame`` and ``bodies.allreduce`` do for it."""
        engine = self.group.runtime.engine
        if not engine.turn_at_once():
            return engine.run_now(self._in_turn, x, out)
        try:
            return self._in_turn(x, out)
        finally:
            engine.end_turn()

    def _in_turn(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        g, call = self.group, self.call
        if g.runtime.failure is not None:   # (as the frame begins: collectives.calls.call)
            raise stopped(call.name, g.runtime)
        quiet = arrays.ieee_floating_point() if self.floating else None
        try:   # (from the number on: a Ctrl-C anywhere after it stops the runtime, as the ranks may be out of step)
            seq = call.renew()
            result = np.empty(self.shape, self.dtype) if out is None else out
            signature = self.template % seq
            flat_in = x if x.ndim == 1 else x.reshape(-1)
            flat_out = result if result.ndim == 1 else result.reshape(-1)
            ready = self.ready
            if ready is not None:
                agreed = ready.run(self.transport, call, signature, flat_in, self.combine, flat_out)
            elif self.combine is not None:
                self.ready = doubling.prepared(self.transport, self.dtype, x.nbytes)
                agreed = self.ready.run(self.transport, call, signature, flat_in, self.combine, flat_out)
            else:
                agreed = algorithms.allreduce_small(self.transport, call, flat_in, flat_out, self.op, signature)
            if not agreed:
                call.disagree(signature)
            self.transport.control.check_gave_up(seq)
        except BaseException as e:
            ended(call, e)
        finally:
            if quiet is not None:
                arrays.restore_floating_point(quiet)
        call.in_step = True
        return result


def lane_for(g: CallGroup, x: Any, op: Any, out: Any) -> Lane | None:
    """The lane that runs ``allreduce(x, op, out)`` on ``g`` now, or None: take the usual way (which
    sets one up, :func:`open_lane`, where it can). ``out``: None, ``x`` (writable), or a writable array
    of x's kind apart from x; anything else is for the usual checks to name."""
    if type(x) is not np.ndarray or type(op) is not str or get_ident() != progress.MAIN_THREAD or progress.on_behalf \
            or timeline.current is not None or execute.observer is not None:
        return None   # (an op of another type is for the usual checks to name: it may not even hash)
    lane = g.runtime.lanes.get((g, x.dtype, x.shape, op))
    if lane is None or g.destroyed:
        return None
    if out is None:
        return lane   # (a strided x is copied into the message as it is)
    if out is x:
        flags = x.flags
        return lane if flags.writeable and flags.c_contiguous else None
    if type(out) is np.ndarray and out.dtype == lane.dtype and out.shape == lane.shape:
        flags = out.flags
        if flags.writeable and flags.c_contiguous and (   # (two arrays that own their memory never overlap)
                x.base is None and out.base is None or not np.may_share_memory(x, out)):
            return lane
    return None


def open_lane(call: Call, x: np.ndarray, op: str) -> None:
    """After ``call``, an all-reduce of host array ``x`` by ``op``, ran by recursive doubling: keep a
    lane for the calls of its kind that follow, where it forced no option."""
    g, runtime = call.group, call.runtime
    if call.thread or call.forced or call.call_name or x.dtype.isbuiltin != 1 or not x.flags.c_contiguous \
            or call.window != runtime.settings.timeout:
        return
    if len(runtime.lanes) >= _MOST_LANES:
        runtime.lanes.clear()
    kept = copy.copy(call)   # (a bound of its own, renewed by each call: see Lane.run)
    kept.background = False
    runtime.lanes[(g, x.dtype, x.shape, op)] = Lane(g, x, op, call.template, kept)
