"""The express lane: a small blocking all-reduce of a host array, as a program repeats it (a
training loop's loss, a metric, a few KiB of gradients), in one frame instead of five layers.

The first call of each kind (group, dtype, shape, op) takes the usual way (``collectives.calls.call``,
``bodies.allreduce``) and, where the runtime would run it by recursive doubling, sets up a
:class:`Lane` for the calls that follow: its checks made once, its signature template, its
``Call`` (the bound of its waits) kept and renumbered. A later call of that kind with no options
(``timeout=``, ``name=``, ``algorithm=``, ``compression=``, ``async_op=``) from the main thread
then runs the lane: the same engine turn, the same message (the signature riding on the data:
``ring.doubling``), the same bounded wait and the same errors, only fewer Python frames (11 instead
of 18 at n=2, ``scripts/call_cost.py``). Anything else, or a lane that no longer fits (the
settings changed, a timeline records), takes the usual way.

    >>> x = np.ones(2, np.float32)                                                   # doctest: +SKIP
    >>> col.allreduce(x)            # sets the lane up                               # doctest: +SKIP
    >>> col.allreduce(x)            # runs it                                        # doctest: +SKIP
"""
from __future__ import annotations

import copy
from threading import get_ident, main_thread
from typing import Any

import numpy as np

from collectives.calls import timeline
from collectives.calls.call import Call, ended, stopped
from collectives.calls.group_protocol import CallGroup
from ring import algorithms, arrays, execute

_MAIN_THREAD = main_thread().ident
_MOST_LANES = 64   # kinds of call kept per runtime (a program that keeps making new shapes does not grow it)


class Lane:
    """What every call of one kind shares: the group, the array's ``dtype`` and ``shape``, the op,
    the signature template, the reused ``call``, and whether its arithmetic is floating point."""

    __slots__ = ("group", "dtype", "shape", "op", "template", "call", "floating")

    def __init__(self, group: CallGroup, x: np.ndarray, op: str, template: bytes, call: Call):
        self.group, self.dtype, self.shape, self.op, self.template = group, x.dtype, x.shape, op, template
        self.call = call
        self.floating = x.dtype.kind in "fc"

    def run(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """One call, in the engine's turn: what ``_frame`` and ``bodies.allreduce`` do for it."""
        g, call = self.group, self.call
        if g.runtime.failure is not None:   # (as the frame begins: collectives.calls.call)
            raise stopped(call.name, g.runtime)
        seq = call.renew()
        result = np.empty(self.shape, self.dtype) if out is None else out
        quiet = arrays.ieee_floating_point() if self.floating else None
        try:
            signature = self.template % seq
            flat_in = x if x.ndim == 1 else x.reshape(-1)
            flat_out = result if result.ndim == 1 else result.reshape(-1)
            if not algorithms.allreduce_small(g.transport, call, flat_in, flat_out, self.op, signature):
                call.disagree(signature)
            g.transport.control.check_gave_up(seq)
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
    if type(x) is not np.ndarray or get_ident() != _MAIN_THREAD or timeline.current is not None \
            or execute.observer is not None:
        return None
    lane = g.runtime.lanes.get((g, x.dtype, x.shape, op))
    if lane is None or g.destroyed:
        return None
    flags = x.flags
    if not flags.c_contiguous:
        return None
    if out is None or (out is x and flags.writeable):
        return lane
    if type(out) is np.ndarray and out.dtype == lane.dtype and out.shape == lane.shape:
        out_flags = out.flags
        if out_flags.writeable and out_flags.c_contiguous and (
                flags.owndata and out_flags.owndata or not np.may_share_memory(x, out)):
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
