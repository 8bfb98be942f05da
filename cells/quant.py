"""INT8 weight-only quantized Linear: weights stored as int8 with one float32 scale per output channel.

Why weight-only: the deployable graphs are memory-bound on their projection weights (4x smaller
stored as int8), while activations stay float32, so no calibration data is needed. The weight is
dequantized inside the graph with standard ops (Cast, Mul), so the cell exports to MindIR and runs on
any backend; its primitives are attributes, as in `Linear`, so parallel strategies can shard them.
"""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from .linear import Linear

INT8_MAX = 127  # symmetric range [-127, 127]: -128 is left unused so +-max|W| map to +-127


def quantize_per_channel(weight: np.ndarray):
    """weight (out, in) float -> (int8 (out, in), float32 scales (out,)) with weight ~= q * scale[:, None].

    scale_c = max|W[c, :]| / 127 (1 for an all-zero row), so each element's error is at most scale_c / 2.
    """
    peak = np.abs(weight).max(axis=1)
    scale = np.where(peak > 0, peak / INT8_MAX, 1.0).astype(np.float32)
    q = np.clip(np.round(weight / scale[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


class Int8Product(nn.Cell):
    """x (rows, in) float32 @ (weight_int8 (out, in) * scale (out,))^T with standard operators (Cast, Mul,
    MatMul): what exports hold; the CPU kernels replace it by FusedInt8MatMul, which reads the int8 weights as
    they are."""

    def __init__(self):
        super().__init__()
        self.cast = ops.Cast()
        self.mul = ops.Mul()
        self.matmul = ops.MatMul(transpose_b=True)
        self.reshape = ops.Reshape()

    def construct(self, x, weight_int8, scale):
        weight = self.mul(self.cast(weight_int8, ms.float32), self.reshape(scale, (-1, 1)))
        return self.matmul(x, weight)


class Int8Linear(nn.Cell):
    """(..., in) -> (..., out) = x @ (weight_int8 * weight_scale[:, None]).T + bias, float32 in and out.

    Parameters: weight_int8 (out, in) int8, weight_scale (out,) float32 (both frozen), bias (out,)
    float32 when the source Linear had one. Build it with `from_linear`.
    """

    def __init__(self, weight_int8: np.ndarray, weight_scale: np.ndarray, bias=None):
        super().__init__()
        self.out_width, self.in_width = weight_int8.shape
        self.has_bias = bias is not None
        self.weight_int8 = Parameter(Tensor(weight_int8, ms.int8), name="weight_int8", requires_grad=False)
        self.weight_scale = Parameter(Tensor(weight_scale, ms.float32), name="weight_scale", requires_grad=False)
        if self.has_bias:
            self.bias = Parameter(Tensor(bias, ms.float32), name="bias")
        self.cast = ops.Cast()
        self.mul = ops.Mul()
        self.product = Int8Product()  # the CPU kernels swap in FusedInt8MatMul
        self.add = ops.Add()
        self.reshape = ops.Reshape()

    @classmethod
    def from_linear(cls, linear: Linear) -> "Int8Linear":
        """The quantized copy of `linear`, with any LoRA update folded into the weight first."""
        state = linear.merged_state()
        return cls(*quantize_per_channel(state["weight"]), state.get("bias"))

    def dequantized_weight(self):
        """(out, in) float32 weight the graph multiplies by."""
        scale = self.reshape(self.weight_scale, (self.out_width, 1))
        return self.mul(self.cast(self.weight_int8, ms.float32), scale)

    def construct(self, x):
        y = self.project(x)
        return self.add(y, self.bias) if self.has_bias else y

    def project(self, x):
        """The product without the bias, as Linear.project (the MLP adds fc1's bias with its activation)."""
        leading = x.shape[:-1]
        y = self.product(self.reshape(x, (-1, self.in_width)), self.weight_int8, self.weight_scale)
        return self.reshape(y, leading + (self.out_width,))

    def extend_repr(self):
        return f"in={self.in_width}, out={self.out_width}, bias={self.has_bias}, int8 per-channel"
