"""SGD with momentum and (L2) weight decay, on the flat parameter buffer."""
from __future__ import annotations


class SGD:
    """``v = momentum * v + (g + weight_decay * p); p -= lr * v``, over the whole flat parameter buffer.

    >>> import numpy as np
    >>> p, g = np.ones(2), np.full(2, 0.5)
    >>> opt = SGD(p, lr=0.1, momentum=0.9, weight_decay=0.0); opt.step(g); p
    array([0.95, 0.95])
    """

    def __init__(self, params, lr: float, momentum: float, weight_decay: float):
        self.params = params
        self.velocity = params * 0
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def step(self, grads) -> None:
        self.velocity *= self.momentum
        self.velocity += grads
        if self.weight_decay:
            self.velocity += self.weight_decay * self.params
        self.params -= self.lr * self.velocity
