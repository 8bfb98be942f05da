"""Normalisation over the last axis (LayerNorm, RMSNorm), behind one factory so it can be swapped (fused kernels).

Parameters are named `weight` and `bias` (the PyTorch/Hugging Face names), matching `nn.Dense`, so
every checkpoint key in mindvl ends in `.weight` or `.bias` and pretrained weights map one to one.
"""
import numpy as np

from mindspore import Parameter, Tensor, nn, ops


class LayerNorm(nn.Cell):
    """LayerNorm over the last axis of (..., width) float tensors; returns the same shape."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.width = width
        self.eps = eps
        self.weight = Parameter(Tensor(np.ones(width, np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros(width, np.float32)), name="bias")
        self.layer_norm = standard_layer_norm(eps)  # cells.kernels may swap in a fused kernel for training

    def construct(self, x):
        return self.layer_norm(x, self.weight, self.bias)[0]

    def extend_repr(self):
        return f"width={self.width}, eps={self.eps}"


def standard_layer_norm(eps: float) -> ops.LayerNorm:
    """MindSpore's LayerNorm over the last axis: (x, weight, bias) -> (y, mean, variance)."""
    return ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=eps)


class RMSNorm(nn.Cell):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (Llama, Qwen2, Gemma), no bias and no mean
    subtraction. The weight is applied as stored: Gemma's "1 + weight" is folded in at conversion."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.width = width
        self.eps = eps
        self.weight = Parameter(Tensor(np.ones(width, np.float32)), name="weight")
        self.rms_norm = StandardRMSNorm(eps)  # cells.kernels may swap in a fused kernel

    def construct(self, x):
        return self.rms_norm(x, self.weight)

    def extend_repr(self):
        return f"width={self.width}, eps={self.eps}"


class StandardRMSNorm(nn.Cell):
    """RMSNorm's arithmetic in MindSpore's operators: (x, weight) -> y."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.square = ops.Square()
        self.mean = ops.ReduceMean(keep_dims=True)
        self.rsqrt = ops.Rsqrt()
        self.mul = ops.Mul()
        self.add = ops.Add()

    def construct(self, x, weight):
        scale = self.rsqrt(self.add(self.mean(self.square(x), -1), self.eps))
        return self.mul(self.mul(x, scale), weight)


NORMS = ("layer", "rms")


def create_norm(width: int, eps: float = 1e-6, kind: str = "layer") -> nn.Cell:
    """The normalisation every block, encoder and decoder uses; change it here to change it everywhere."""
    if kind == "layer":
        return LayerNorm(width, eps)
    if kind == "rms":
        return RMSNorm(width, eps)
    raise ValueError(f"norm: expected one of {list(NORMS)}, got {kind!r}")

