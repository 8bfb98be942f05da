"""Activation functions used by every MLP, behind one factory, and the attention softmax.

Kept in one small module so a fused CPU (or Ascend) kernel can replace an activation later without
touching the blocks. Each activation is a Cell whose primitives are attributes, so a parallel strategy
can call `.shard()` on them.
"""
import math

from mindspore import nn, ops

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")


class GELU(nn.Cell):
    """Exact GELU, 0.5 * x * (1 + erf(x / sqrt(2))), as BERT, ViT and Whisper use it."""

    def __init__(self):
        super().__init__()
        self.erf = ops.Erf()
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.inv_sqrt2 = 1.0 / math.sqrt(2.0)

    def construct(self, x):
        cdf = self.add(self.erf(self.mul(x, self.inv_sqrt2)), 1.0)
        return self.mul(self.mul(x, cdf), 0.5)


class GELUTanh(nn.Cell):
    """GELU with the tanh approximation (MindSpore's GeLU primitive computes exactly this)."""

    def __init__(self):
        super().__init__()
        self.gelu = ops.GeLU()

    def construct(self, x):
        return self.gelu(x)


class ReLU(nn.Cell):
    def __init__(self):
        super().__init__()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.relu(x)


class Softmax(nn.Cell):
    """Softmax over the last axis, a Cell of its own so a precision policy can keep it in float32 and a
    fused kernel can replace it."""

    def __init__(self):
        super().__init__()
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, x):
        return self.softmax(x)


def create_activation(name: str) -> nn.Cell:
    """Return a new activation Cell for `name` ("gelu" exact erf, "gelu_tanh", "relu")."""
    if name == "gelu":
        return GELU()
    if name == "gelu_tanh":
        return GELUTanh()
    if name == "relu":
        return ReLU()
    raise ValueError(f"activation: expected one of {list(ACTIVATIONS)}, got {name!r}")
