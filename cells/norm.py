"""Layer normalisation over the last axis, behind one factory so it can be swapped (RMSNorm, fused kernels).

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


def create_norm(width: int, eps: float = 1e-6) -> nn.Cell:
    """The normalisation every block and encoder uses; change it here to change it everywhere."""
    return LayerNorm(width, eps)

