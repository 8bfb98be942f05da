"""Multi-head self-attention, the one attention every encoder and the fusion stack use.

Layout follows BERT/Whisper (separate q/k/v/out projections, weights (out, in)) so pretrained weights
load by name. Every primitive used in `construct` is an attribute created in `__init__`, so parallel
strategies can call `.shard()` on them; only standard MindSpore ops are used, so graphs export to
MindIR.
"""
import math

from mindspore import nn, ops

from .activation import ScaledMaskedSoftmax
from .linear import dense
from .masks import MASK_VALUE  # re-exported: callers build masks with this constant

__all__ = ["AttentionCore", "MultiHeadAttention", "MASK_VALUE"]


class AttentionCore(nn.Cell):
    """softmax(Q K^T / sqrt(head_dim) + mask) V over `heads` heads, from and to (batch, seq, heads * head_dim)
    projections: the part a fused kernel (cells/kernels: AOT on CPU, flash attention on Ascend) replaces
    whole. The head split and merge are transposes here; fused kernels read the heads in place."""

    def __init__(self, heads: int, head_dim: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.qk_matmul = ops.BatchMatMul(transpose_b=True)
        self.av_matmul = ops.BatchMatMul()
        self.softmax = ScaledMaskedSoftmax(1.0 / math.sqrt(head_dim))
        self.attn_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def _split_heads(self, x, batch, seq):
        x = self.reshape(x, (batch, seq, self.heads, self.head_dim))  # (batch, seq, heads, head_dim)
        return self.transpose(x, (0, 2, 1, 3))  # (batch, heads, seq, head_dim)

    def construct(self, q, k, v, mask=None):
        batch, seq = q.shape[0], q.shape[1]
        q, k, v = self._split_heads(q, batch, seq), self._split_heads(k, batch, seq), self._split_heads(v, batch, seq)
        probs = self.attn_dropout(self.softmax(self.qk_matmul(q, k), mask))  # (batch, heads, seq, seq)
        out = self.av_matmul(probs, v)  # (batch, heads, seq, head_dim)
        return self.reshape(self.transpose(out, (0, 2, 1, 3)), (batch, seq, self.heads * self.head_dim))

    def extend_repr(self):
        return f"heads={self.heads}, head_dim={self.head_dim}"


class MultiHeadAttention(nn.Cell):
    """q/k/v projections, the attention core over `heads` heads, then an output projection.

    x: (batch, seq, width) float32; mask: additive float broadcastable to (batch, heads, seq, seq),
    usually (batch, 1, 1, seq) or (batch, 1, seq, seq) with 0 allowed / MASK_VALUE blocked, or None.
    Returns (batch, seq, width).

    head_dim 0 takes width // heads (width must divide); > 0 sets it, so the attention's inner width
    heads * head_dim may differ from width: a model whose heads were pruned (mindvl.train.prune) keeps
    its head size with fewer heads. q/k/v project width -> heads * head_dim, out_proj projects back.
    """

    def __init__(self, width: int, heads: int, dropout: float = 0.0, lora_rank: int = 0, lora_alpha: float = 16.0,
                 head_dim: int = 0):
        super().__init__()
        if head_dim < 0:
            raise ValueError(f"attention head_dim: expected 0 (width // heads) or a positive size, got {head_dim}")
        if not head_dim and width % heads:
            raise ValueError(f"attention width {width} is not divisible by heads={heads}")
        self.width = width
        self.heads = heads
        self.head_dim = head_dim or width // heads
        self.inner_width = heads * self.head_dim
        inner = self.inner_width
        self.q_proj = dense(width, inner, lora_rank=lora_rank, lora_alpha=lora_alpha)  # LoRA on q and v, as
        self.k_proj = dense(width, inner)
        self.v_proj = dense(width, inner, lora_rank=lora_rank, lora_alpha=lora_alpha)  # the LoRA paper does
        self.out_proj = dense(inner, width)
        self.core = AttentionCore(heads, self.head_dim, dropout)

    def construct(self, x, mask=None):
        return self.out_proj(self.core(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask))

    def extend_repr(self):
        return f"width={self.width}, heads={self.heads}, head_dim={self.head_dim}"
