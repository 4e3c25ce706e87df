"""A multi-layer perceptron (ReLU, softmax cross-entropy), forward and backward by hand.

Parameters and gradients are views into two flat buffers, so averaging every
gradient across ranks is one fused allreduce of ``grads`` and broadcasting the
model is one broadcast of ``params``. Written on the array API that numpy and
cupy share (``xp``), so the same code runs on either.
"""
from __future__ import annotations

import numpy as np

from collectives import timeline


class MLP:
    """``sizes = [inputs, hidden..., classes]``; ``params[name]``/``grads[name]`` are views of the flat buffers.

    >>> m = MLP([4, 8, 3], np.random.default_rng(0), np.float64)
    >>> list(m.params), m.flat_params.size
    (['w0', 'b0', 'w1', 'b1'], 67)

    With ``tp``, a tensor-parallel group of T ranks, the layers are split as Megatron-LM
    splits a transformer's MLP: in each pair of layers, the first is column-parallel (each
    rank holds 1/T of its outputs: its columns of ``w`` and its part of ``b``) and the second
    row-parallel (the matching rows of ``w``; ``b`` whole); a last unpaired layer is whole on
    every rank. Forward sums the row-parallel layer's partial products over the group (one
    all-reduce per pair), backward sums the gradient flowing out of the column-parallel layer
    (one per pair, but for the first pair, whose input is the data). The model is the same
    as on one rank: ``to_full``/``load_full`` convert the flat buffers to and from the whole
    model's layout (``MLP(sizes)``), which is what checkpoints hold. 2 ranks, sizes [64, 8, 10]:

    =====  ======  ===================  ===================  ==================
    layer  kind    rank 0 holds         rank 1 holds         forward ends with
    =====  ======  ===================  ===================  ==================
    0      column  w0[:, 0:4], b0[0:4]  w0[:, 4:8], b0[4:8]  ReLU, on its part
    1      row     w1[0:4, :], b1       w1[4:8, :], b1       all-reduce, + b1
    =====  ======  ===================  ===================  ==================
    """

    def __init__(self, sizes: list[int], rng: np.random.Generator, dtype, xp=np, tp=None):
        self.tp = tp
        parts = tp.size() if tp is not None else 1
        self.layers = len(sizes) - 1
        self.kinds = [layer_kind(i, self.layers, parts) for i in range(self.layers)]
        self.full_sizes = list(sizes)
        full_shapes, shapes, self._slices = {}, {}, {}
        for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            full_shapes[f"w{i}"], full_shapes[f"b{i}"] = (fan_in, fan_out), (fan_out,)
            mine = _part(fan_in if self.kinds[i] == "row" else fan_out, parts, tp.rank() if tp else 0)
            self._slices[f"w{i}"] = {"column": (slice(None), mine), "row": (mine, slice(None))}.get(self.kinds[i], ())
            self._slices[f"b{i}"] = (mine,) if self.kinds[i] == "column" else ()
            for name in (f"w{i}", f"b{i}"):
                shapes[name] = np.empty(full_shapes[name], np.int8)[self._slices[name]].shape
        self._full_shapes = full_shapes
        total = sum(int(np.prod(s)) for s in shapes.values())
        self.xp = xp
        self.flat_params = xp.zeros(total, dtype=dtype)
        self.flat_grads = xp.zeros(total, dtype=dtype)
        self.params, self.grads, self._offsets, offset = {}, {}, {}, 0
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            self._offsets[name] = offset
            self.params[name] = self.flat_params[offset: offset + size].reshape(shape)
            self.grads[name] = self.flat_grads[offset: offset + size].reshape(shape)
            offset += size
            if name.startswith("w"):   # He initialisation of the whole layer, drawn on the host for reproducibility
                fan_in = full_shapes[name][0]
                init = rng.normal(scale=np.sqrt(2.0 / fan_in), size=full_shapes[name]).astype(dtype)
                self.params[name][...] = xp.asarray(init[self._slices[name]])
        self._spans = [(self._offsets[f"w{i}"], self._offsets[f"b{i}"] + self.params[f"b{i}"].size)
                       for i in range(self.layers)]

    def full_size(self) -> int:
        """How many parameters the whole model has (the flat buffers' size on one rank)."""
        return sum(int(np.prod(s)) for s in self._full_shapes.values())

    def to_full(self, flat):
        """The whole model's flat buffer from this rank's ``flat`` (its parameters, or anything laid out
        like them, such as the optimizer's velocity): gathered over the tensor-parallel group, so
        every rank of it must call this together. Without one, ``flat`` itself."""
        if self.tp is None:
            return flat
        every = self.tp.allgather(flat[None, :])   # (T, local size): rank t's flat buffer in row t
        pieces = []
        for name, shape in self._full_shapes.items():
            offset, size = self._offsets[name], self.params[name].size
            parts = [row[offset: offset + size].reshape(self.params[name].shape) for row in every]
            axis = {("column", "w"): 1, ("column", "b"): 0, ("row", "w"): 0}.get((self.kinds[int(name[1:])], name[0]))
            pieces.append((self.xp.concatenate(parts, axis=axis) if axis is not None else parts[0]).reshape(-1))
        return self.xp.concatenate(pieces)

    def load_full(self, full, into=None) -> None:
        """Set this rank's part (of the parameters, or of ``into``, laid out like them) from the
        whole model's flat buffer ``full``."""
        into = self.flat_params if into is None else into
        offset = 0
        for name, shape in self._full_shapes.items():
            size = int(np.prod(shape))
            whole = full[offset: offset + size].reshape(shape)
            start = self._offsets[name]
            into[start: start + self.params[name].size] = whole[self._slices[name]].reshape(-1)
            offset += size

    def _linear(self, i: int, a):
        """Layer ``i``'s pre-activation for input ``a``; a row-parallel layer sums its partial
        products over the tensor-parallel group before adding its (whole) bias."""
        z = a @ self.params[f"w{i}"]
        if self.kinds[i] == "row":
            z = self.tp.allreduce(z, out=z, name=f"forward {i}")
        return z + self.params[f"b{i}"]

    def logits(self, x):
        h = x
        for i in range(self.layers):
            h = self._linear(i, h)
            if i < self.layers - 1:
                h = self.xp.maximum(h, 0)
        return h

    def layer_span(self, i: int) -> tuple[int, int]:
        """Where layer ``i``'s gradients (``w{i}`` then ``b{i}``) lie in ``flat_grads``: [start, stop).
        The layers lie in order, so layers i..j are one contiguous span too.

        >>> MLP([4, 8, 3], np.random.default_rng(0), np.float64).layer_span(1)
        (40, 67)
        """
        return self._spans[i]

    def loss_and_grads(self, x, y, scale: float, layer_done=None) -> float:
        """Write ``scale * sum over the batch`` of per-sample gradients into ``grads``; return the loss sum.

        With ``scale = 1 / global batch size`` the ranks' gradients add up (allreduce
        "sum") to exactly the gradient of the mean loss over the global batch.
        ``layer_done(i)`` is called as soon as layer ``i``'s gradients are written (last layer
        first), so that their all-reduce can start while backward goes on.
        """
        xp = self.xp
        activations = [x]
        with timeline.span("forward"):
            for i in range(self.layers):
                z = self._linear(i, activations[-1])
                activations.append(xp.maximum(z, 0) if i < self.layers - 1 else z)
        logits = activations[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        rows = xp.arange(len(y))
        loss_sum = float(-log_probs[rows, y].sum())
        delta = xp.exp(log_probs)
        delta[rows, y] -= 1
        delta *= scale
        for i in reversed(range(self.layers)):
            with timeline.span(f"backward {i}"):
                self.grads[f"w{i}"][...] = activations[i].T @ delta
                self.grads[f"b{i}"][...] = delta.sum(axis=0)
                if layer_done is not None:
                    layer_done(i)
                if i > 0:
                    upstream = delta @ self.params[f"w{i}"].T
                    if self.kinds[i] == "column":   # each rank holds part of the sum over this layer's outputs
                        upstream = self.tp.allreduce(upstream, out=upstream, name=f"backward {i}")
                    delta = upstream * (activations[i] > 0)
        return loss_sum


def layer_kind(i: int, layers: int, parts: int) -> str:
    """How layer ``i`` of ``layers`` is split over ``parts`` tensor-parallel ranks: "whole" (not
    split), "column" (the first of a pair) or "row" (the second).

    >>> [layer_kind(i, 3, 2) for i in range(3)], [layer_kind(i, 2, 1) for i in range(2)]
    (['column', 'row', 'whole'], ['whole', 'whole'])
    """
    if parts == 1 or (i % 2 == 0 and i == layers - 1):
        return "whole"
    return "column" if i % 2 == 0 else "row"


def split_widths(sizes: list[int], parts: int) -> list[int]:
    """The widths that ``parts`` tensor-parallel ranks split (each column-parallel layer's outputs),
    which must divide evenly so that every rank's buffers have the same layout.

    >>> split_widths([64, 30, 20, 10], 2)
    [30]
    """
    layers = len(sizes) - 1
    return [sizes[i + 1] for i in range(layers) if layer_kind(i, layers, parts) == "column"]


def _part(width: int, parts: int, rank: int) -> slice:
    share = width // parts
    return slice(rank * share, (rank + 1) * share)
