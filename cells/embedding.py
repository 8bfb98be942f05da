"""Lookup tables and fixed position tables.

`Embedding` keeps its table as a Parameter named `weight` (vocab, width), the PyTorch/Hugging Face key,
so `text.word_embeddings.weight` loads from a BERT checkpoint by name. Its Gather primitive is an
attribute so a parallel strategy can shard the table.
"""
import numpy as np

from mindspore import Parameter, nn, ops
from mindspore.common.initializer import TruncatedNormal, initializer

from .linear import INIT_STD


class Embedding(nn.Cell):
    """ids (...) int32 -> vectors (..., width) float32; ids must lie in [0, num_embeddings)."""

    def __init__(self, num_embeddings: int, width: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.width = width
        self.weight = Parameter(initializer(TruncatedNormal(INIT_STD), (num_embeddings, width)), name="weight")
        self.gather = ops.Gather()

    def construct(self, ids):
        return self.gather(self.weight, ids, 0)

    def extend_repr(self):
        return f"num_embeddings={self.num_embeddings}, width={self.width}"


def sinusoids(length: int, width: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's fixed positions: (length, width) float32, [sin | cos] halves with geometric timescales."""
    if width % 2:
        raise ValueError(f"sinusoidal positions need an even width, got {width}")
    log_increment = np.log(max_timescale) / (width // 2 - 1)
    inv_timescales = np.exp(-log_increment * np.arange(width // 2))
    scaled_time = np.arange(length)[:, None] * inv_timescales[None, :]
    return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1).astype(np.float32)


def learned_tokens(*shape: int) -> Parameter:
    """A learned token or position table (CLS tokens, ViT positions), truncated-normal initialised."""
    return Parameter(initializer(TruncatedNormal(INIT_STD), shape), name="value")


__all__ = ["Embedding", "sinusoids", "learned_tokens"]
