"""Rotary position embeddings (RoPE), the "rotate half" layout of GPT-NeoX, Llama, Qwen2 and Gemma in
Hugging Face's weights: dimension i of a head pairs with dimension i + head_dim / 2.

Positions are an input (batch, seq), not a range: a left-padded prompt's tokens start at position 0
after their padding, and a decode step rotates its one token by the position it has.
"""
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype


class Rotary(nn.Cell):
    """positions (batch, seq) int32 -> (cos, sin), each (batch, seq, 1, head_dim) float32, for `rotate`."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta
        inverse = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        self.inverse_frequencies = Tensor(inverse.astype(np.float32))  # a constant of the graph
        self.cast = ops.Cast()
        self.mul = ops.Mul()
        self.concat = ops.Concat(axis=-1)
        self.cos = ops.Cos()
        self.sin = ops.Sin()
        self.expand = ops.ExpandDims()

    def construct(self, positions):
        angles = self.mul(self.expand(self.cast(positions, mstype.float32), -1), self.inverse_frequencies)
        angles = self.expand(self.concat((angles, angles)), 2)  # (batch, seq, 1, head_dim)
        return self.cos(angles), self.sin(angles)

    def extend_repr(self):
        return f"head_dim={self.head_dim}, theta={self.theta:g}"


class RotateHalf(nn.Cell):
    """x (batch, seq, heads, head_dim) rotated by (cos, sin): x * cos + (-x2, x1) * sin."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.split = ops.Split(axis=-1, output_num=2)
        self.concat = ops.Concat(axis=-1)
        self.neg = ops.Neg()
        self.mul = ops.Mul()
        self.add = ops.Add()

    def construct(self, x, cos, sin):
        first, second = self.split(x)
        return self.add(self.mul(x, cos), self.mul(self.concat((self.neg(second), first)), sin))
