"""Gradient buckets: each one's all-reduce starts as soon as backward has produced it (DDP's overlap).

Backward produces gradients last layer first. The layers' gradients lie in order in the
flat gradient buffer, so the layers from i to j are one contiguous span: a bucket is a
slice of that buffer, reduced in place (``async_op=True``) with no copy. Walking the
layers from the last, a bucket closes once it holds at least its cap; the first bucket's
cap is at most 1 MiB (as DDP's), so that communication starts early. Layers 0, 1, 2 of
4 MB, 1.2 MB and 0.05 MB with a 2 MB cap (the example below):

=======  =================  =============  ===============================
bucket   layers, in order   bytes          launched when backward is done
         of backward                       with layer
=======  =================  =============  ===============================
0        2, 1               1.25 MB        1
1        0                  4 MB           0
=======  =================  =============  ===============================
"""
from __future__ import annotations

from time import perf_counter

import collectives as col

FIRST_BUCKET_BYTES = 1 << 20


class GradientBuckets:
    """Launch each bucket's all-reduce when backward reaches its first layer; ``wait`` for them all.

    >>> import numpy as np
    >>> from trainer.model import MLP
    >>> m = MLP([1000, 1000, 300, 40], np.random.default_rng(0), np.float32)
    >>> GradientBuckets(m, cap_bytes=2_000_000).plan   # (completing layer, start, stop) in flat_grads
    [(1, 1001000, 1313340), (0, 0, 1001000)]
    """

    def __init__(self, model, cap_bytes: float, group: col.Group | None = None, feedback=None):
        self.flat = model.flat_grads
        self.group = group   # the ranks that average these gradients (None: the world)
        # --compression: each bucket's part of this rank's residual is added to it, and what the
        # rounding to the wire type takes is kept, just before its all-reduce (trainer.compression)
        self.feedback = feedback
        self.options = {"compression": feedback.codec} if feedback is not None else {}
        itemsize = self.flat.dtype.itemsize
        self.plan: list[tuple[int, int, int]] = []   # (layer that completes it, start, stop), in launch order
        cap, stop = min(FIRST_BUCKET_BYTES, cap_bytes), None
        for i in reversed(range(model.layers)):
            start, layer_stop = model.layer_span(i)
            stop = layer_stop if stop is None else stop
            if (stop - start) * itemsize >= cap or i == 0:
                self.plan.append((i, start, stop))
                cap, stop = cap_bytes, None
        self._launch_at = {layer: k for k, (layer, _, _) in enumerate(self.plan)}
        self.works: list[col.Work] = []

    def layer_done(self, layer: int) -> None:
        """Backward has written ``layer``'s gradients: launch the bucket it completes, if any. The
        last bucket completes with backward itself, so it has nothing to hide behind: ``wait``
        reduces it in the calling thread, which saves the hand-over to the progress thread."""
        k = self._launch_at.get(layer)
        if k is not None and k < len(self.plan) - 1:
            span = self._span(k)
            self.works.append(col.allreduce(span, out=span, async_op=True, name=f"bucket {k}", group=self.group,
                                            **self.options))

    def _span(self, k: int):
        """Bucket ``k``'s slice of the flat gradients, made ready to send (compressed: with its residual)."""
        _, start, stop = self.plan[k]
        if self.feedback is not None:
            self.feedback.contribute(self.flat[start:stop], start, stop)
        return self.flat[start:stop]

    def wait(self) -> tuple[float, float]:
        """Reduce the last bucket and wait for the others; return (seconds the buckets' all-reduces
        were in flight, seconds of that spent here, after backward: the communication backward did not
        hide). The second is part of the first by construction: time here with nothing in flight (the
        handles' own bookkeeping) counts as neither."""
        waiting = perf_counter()
        last = len(self.plan) - 1
        last_span = self._span(last)   # reduced after the others: the engine runs calls in issue order
        col.allreduce(last_span, out=last_span, name=f"bucket {last}", group=self.group, **self.options)
        done = perf_counter()
        for work in self.works:
            work.wait()
        in_flight, exposed, reach = 0.0, 0.0, float("-inf")
        for began, ended in [(w.issued_at, w.completed_at) for w in self.works] + [(waiting, done)]:
            began = max(began, reach)   # the union of the intervals: they run one after another
            if ended > began:
                in_flight += ended - began
                exposed += max(0.0, ended - max(began, waiting))
                reach = ended
        self.works = []
        return in_flight, exposed
