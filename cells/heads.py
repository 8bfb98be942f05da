"""Output heads: contrastive projections with a learned temperature, the answer classifier, the LM head."""
import numpy as np

from mindspore import Parameter, Tensor, nn, ops

from .linear import dense
from .norm import create_norm

MAX_LOGIT_SCALE = 100.0  # CLIP's clamp: keeps the softmax temperature from collapsing


class ContrastiveHead(nn.Cell):
    """pooled (B, in_width) -> unit-length embedding (B, embed_dim); `fc` has no bias (CLIP)."""

    def __init__(self, in_width: int, embed_dim: int):
        super().__init__()
        self.fc = dense(in_width, embed_dim, has_bias=False)
        # x * rsqrt(sum(x^2)) rather than ops.L2Normalize, whose CPU gradient kernel is ~20x slower
        self.square = ops.Square()
        self.reduce_sum = ops.ReduceSum(keep_dims=True)
        self.rsqrt = ops.Rsqrt()
        self.maximum = ops.Maximum()
        self.mul = ops.Mul()

    def construct(self, x):
        x = self.fc(x)
        return self.mul(x, self.rsqrt(self.maximum(self.reduce_sum(self.square(x), -1), 1e-24)))


class LogitScale(nn.Cell):
    """A learned log-temperature `value`; construct() -> min(exp(value), 100), a scalar.

    The parameter has shape (1,), not (), because MindSpore's AdamWeightDecay rejects 0-d parameters.
    """

    def __init__(self, init: float):
        super().__init__()
        self.value = Parameter(Tensor(np.array([init], np.float32)), name="value")
        self.exp = ops.Exp()
        self.minimum = ops.Minimum()

    def construct(self):
        return self.minimum(self.exp(self.value), MAX_LOGIT_SCALE)[0]


class NormDenseHead(nn.Cell):
    """LayerNorm then Dense: (..., width) -> (..., out). The answer classifier (fusion CLS -> answer
    logits) and the LM head (answer states -> next-token logits) are both this."""

    def __init__(self, width: int, out_width: int, norm_eps: float = 1e-6):
        super().__init__()
        self.norm = create_norm(width, norm_eps)
        self.fc = dense(width, out_width)

    def construct(self, x):
        return self.fc(self.norm(x))
