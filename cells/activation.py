"""Activation functions used by every MLP, behind one factory, and the attention softmax.

Kept in one small module so a fused CPU (or Ascend) kernel can replace an activation without touching
the blocks (cells/kernels swaps BiasActivation and ScaledMaskedSoftmax whole). Each activation is a Cell
whose primitives are attributes, so a parallel strategy can call `.shard()` on them.
"""
import math

from mindspore import nn, ops

from mindvl.choices import DECODER_ACTIVATIONS


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


class SiLU(nn.Cell):
    """x * sigmoid(x) (Llama's and Qwen2's gated MLP)."""

    def __init__(self):
        super().__init__()
        self.sigmoid = ops.Sigmoid()
        self.mul = ops.Mul()

    def construct(self, x):
        return self.mul(x, self.sigmoid(x))


class QuickGELU(nn.Cell):
    """x * sigmoid(1.702 x): OpenAI CLIP's GELU approximation, which Qwen2-VL's vision tower uses."""

    def __init__(self):
        super().__init__()
        self.sigmoid = ops.Sigmoid()
        self.mul = ops.Mul()

    def construct(self, x):
        return self.mul(x, self.sigmoid(self.mul(x, 1.702)))


class BiasActivation(nn.Cell):
    """activation(x + bias): the MLP's first projection hands its bias over, so that one fused kernel can
    add it, activate, and on the way back return the bias gradient (a column sum MindSpore would run as
    a separate ReduceSum)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.add = ops.Add()
        self.act = create_activation(name)

    def construct(self, x, bias):
        return self.act(self.add(x, bias))

    def extend_repr(self):
        return self.name


class ScaledMaskedSoftmax(nn.Cell):
    """softmax(scale * scores + mask) over the last axis (mask additive, broadcastable, or None): a Cell of
    its own so a precision policy can keep it in float32 and a fused kernel can replace it."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, scores, mask=None):
        scores = self.mul(scores, self.scale)
        if mask is not None:
            scores = self.add(scores, mask)
        return self.softmax(scores)

    def extend_repr(self):
        return f"scale={self.scale:g}"


def create_activation(name: str) -> nn.Cell:
    """Return a new activation Cell for `name` ("gelu" exact erf, "gelu_tanh", "relu", "silu", "quick_gelu")."""
    return {"gelu": GELU, "gelu_tanh": GELUTanh, "relu": ReLU, "silu": SiLU,
            "quick_gelu": QuickGELU}[DECODER_ACTIVATIONS.check("activation", name)]()
