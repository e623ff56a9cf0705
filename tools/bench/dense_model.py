"""For benchmarking: a model the benchmark scripts share.

The benchmark's second model: a stack of square Dense layers (issue 11's 4 x Dense(1024, 1024)).

Few, large tensors (4.2M parameters in 8 tensors at the default size), the opposite of the demo
LM's many small ones: its step time shows what each stage costs per byte rather than per launch.
"""
from typing import Tuple

import numpy as np
from mindspore import Tensor, nn, ops

__all__ = ["DenseStack", "DenseLoss", "build_dense", "dense_batch"]


class DenseStack(nn.Cell):
    """``layers`` x ``Dense(width, width)`` with ReLU between them."""

    def __init__(self, layers: int, width: int):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(width, width) for _ in range(layers)])
        self.relu = nn.ReLU()

    def construct(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = self.relu(x)
        return x


class DenseLoss(nn.Cell):
    """Mean squared error of ``net(x)`` against ``y``."""

    def __init__(self, net: DenseStack):
        super().__init__()
        self.net = net

    def construct(self, x, y):
        return ops.mean(ops.square(self.net(x) - y))


def build_dense(layers: int, width: int, seed: int) -> DenseStack:
    """A ``DenseStack`` with deterministic weights (identical on every rank and process)."""
    net = DenseStack(layers, width)
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        value = rng.standard_normal(p.shape) / np.sqrt(width) if len(p.shape) > 1 else np.zeros(p.shape)
        p.set_data(Tensor(value.astype(np.float32), p.dtype))
    return net


def dense_batch(seed: int, step: int, batch: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) float32 ``(batch, width)`` of one global batch, a pure function of its arguments."""
    rng = np.random.default_rng([seed, step])
    return (rng.standard_normal((batch, width)).astype(np.float32),
            rng.standard_normal((batch, width)).astype(np.float32))
