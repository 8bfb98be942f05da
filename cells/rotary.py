"""Rotary position embeddings (RoPE), the "rotate half" layout of GPT-NeoX, Llama, Qwen2 and Gemma in
Hugging Face's weights: dimension i of a head pairs with dimension i + head_dim / 2.

Positions are an input (batch, seq), not a range: a left-padded prompt's tokens start at position 0
after their padding, and a decode step rotates its one token by the position it has.
"""
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype


def frequency_ladder(dim: int, theta: float) -> np.ndarray:
    """RoPE's dim / 2 inverse frequencies 1 / theta^(2i / dim), float64."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


class Rotary(nn.Cell):
    """positions (batch, seq) int32 -> (cos, sin), each (batch, seq, 1, head_dim) float32, for `rotate`."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta
        self.inverse_frequencies = Tensor(frequency_ladder(head_dim, theta).astype(np.float32))  # a graph constant
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


class AxialRotary(nn.Cell):
    """Rotary embeddings over several position axes: positions (batch, seq, axes) -> (cos, sin), each (batch, seq,
    1, head_dim) float32, for `RotateHalf`. Frequency k of the half head (inverse_frequencies[k]) turns with the
    position on axis `axis_of[k]`: the native-resolution vision tower's 2D rotary (height, then width, each over
    the same frequencies) and M-RoPE (time, height, width sections of one frequency ladder) are both this.

    The angles are one MatMul of the positions by a (axes, head_dim / 2) table holding each frequency in its
    axis' row (zero elsewhere), so each angle is exactly position x frequency."""

    def __init__(self, inverse_frequencies, axis_of):
        super().__init__()
        inverse = np.asarray(inverse_frequencies, np.float64)
        axis_of = np.asarray(axis_of, np.int64)
        if inverse.shape != axis_of.shape or inverse.ndim != 1:
            raise ValueError(f"axial rotary: {inverse.shape} frequencies for {axis_of.shape} axis choices")
        self.axes = int(axis_of.max()) + 1
        self.head_dim = 2 * len(inverse)
        table = np.zeros((self.axes, len(inverse)), np.float32)
        table[axis_of, np.arange(len(inverse))] = inverse
        self.table = Tensor(table)  # a constant of the graph
        self.cast = ops.Cast()
        self.matmul = ops.MatMul()
        self.reshape = ops.Reshape()
        self.concat = ops.Concat(axis=-1)
        self.cos = ops.Cos()
        self.sin = ops.Sin()
        self.expand = ops.ExpandDims()

    def construct(self, positions):
        batch, seq = positions.shape[0], positions.shape[1]
        flat = self.reshape(self.cast(positions, mstype.float32), (batch * seq, self.axes))
        angles = self.reshape(self.matmul(flat, self.table), (batch, seq, self.head_dim // 2))
        angles = self.expand(self.concat((angles, angles)), 2)  # (batch, seq, 1, head_dim)
        return self.cos(angles), self.sin(angles)

    def extend_repr(self):
        return f"axes={self.axes}, head_dim={self.head_dim}"


def vision_rotary(head_dim: int, theta: float = 10000.0) -> AxialRotary:
    """The native-resolution vision tower's 2D rotary: a ladder over head_dim / 2 (head_dim / 4 frequencies) for
    the height, the same for the width."""
    if head_dim % 4:
        raise ValueError(f"2D rotary embeddings need a head_dim divisible by 4, got {head_dim}")
    inverse = frequency_ladder(head_dim // 2, theta)
    return AxialRotary(np.concatenate([inverse, inverse]), [0] * len(inverse) + [1] * len(inverse))


def sectioned_rotary(head_dim: int, theta: float, sections) -> AxialRotary:
    """M-RoPE: the 1-D ladder of head_dim / 2 frequencies, its first sections[0] turned by the time position, the
    next sections[1] by the height, the last by the width (Qwen2-VL's mrope_section)."""
    if sum(sections) * 2 != head_dim:
        raise ValueError(f"M-RoPE sections {list(sections)} must sum to head_dim / 2 = {head_dim // 2}")
    return AxialRotary(frequency_ladder(head_dim, theta), np.repeat(np.arange(len(sections)), sections))
