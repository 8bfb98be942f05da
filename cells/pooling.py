"""Mean pooling over the valid tokens of a sequence: the audio encoder's pooled output and the text
encoder's sentence embedding when it follows sentence-transformers (`model.text.pooling: mean`)."""
from mindspore import nn, ops


class MaskedMean(nn.Cell):
    """tokens (batch, N, width), valid (batch, N) float {1, 0} -> (batch, width): the mean of the valid
    tokens (zero for a sequence with none)."""

    def __init__(self):
        super().__init__()
        self.mul = ops.Mul()
        self.div = ops.Div()
        self.maximum = ops.Maximum()
        self.reduce_sum = ops.ReduceSum()
        self.expand_dims = ops.ExpandDims()

    def construct(self, tokens, valid):
        weights = self.expand_dims(valid, 2)  # (batch, N, 1)
        count = self.maximum(self.reduce_sum(weights, 1), 1.0)  # (batch, 1)
        return self.div(self.reduce_sum(self.mul(tokens, weights), 1), count)
