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
    """

    def __init__(self, sizes: list[int], rng: np.random.Generator, dtype, xp=np):
        shapes = {}
        for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            shapes[f"w{i}"], shapes[f"b{i}"] = (fan_in, fan_out), (fan_out,)
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
            if name.startswith("w"):   # He initialisation, drawn on the host for reproducibility
                init = rng.normal(scale=np.sqrt(2.0 / shape[0]), size=shape).astype(dtype)
                self.params[name][...] = xp.asarray(init)
        self.layers = len(sizes) - 1
        self._spans = [(self._offsets[f"w{i}"], self._offsets[f"b{i}"] + sizes[i + 1]) for i in range(self.layers)]

    def logits(self, x):
        h = x
        for i in range(self.layers):
            h = h @ self.params[f"w{i}"] + self.params[f"b{i}"]
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
                z = activations[-1] @ self.params[f"w{i}"] + self.params[f"b{i}"]
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
                    delta = (delta @ self.params[f"w{i}"].T) * (activations[i] > 0)
        return loss_sum
