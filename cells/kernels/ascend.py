"""The attention core on Ascend: MindSpore's flash attention (ops.FlashAttentionScore), which computes
scores, scale, mask, softmax, dropout and the weighted sum on chip without writing the (seq, seq)
probabilities out, in the (batch, seq, heads * head_dim) layout mindvl's projections already have.

Nothing here runs on a CPU (the operator has Ascend kernels only), so what can be checked without a
chip is checked statically: `flash_attention_problems` lists why a core cannot use it (head size, head
count, dtype), and the mask conversion is standard operators tested on the CPU.
"""
from typing import List

from mindspore import nn, ops
from mindspore import dtype as mstype
from mindspore.ops.operations.nn_ops import FlashAttentionScore

from mindvl.cells.attention import AttentionCore

MAX_HEADS, MAX_HEAD_DIM, HEAD_DIM_MULTIPLE = 256, 512, 16  # FlashAttentionScore's documented limits
DTYPES = {"float16": mstype.float16, "bfloat16": mstype.bfloat16}  # the operator takes no float32


def flash_attention_problems(heads: int, head_dim: int, compute: str) -> List[str]:
    """Why an attention core of `heads` x `head_dim` computing in `compute` cannot run as flash attention
    (empty: it can)."""
    problems = []
    if head_dim % HEAD_DIM_MULTIPLE or head_dim > MAX_HEAD_DIM:
        problems.append(f"head_dim {head_dim} must be a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}")
    if heads > MAX_HEADS:
        problems.append(f"{heads} heads exceed {MAX_HEADS}")
    if compute not in DTYPES:
        problems.append(f"train.precision.compute {compute!r} must be float16 or bfloat16 (no float32 kernel)")
    return problems


class BlockedPositions(nn.Cell):
    """mindvl's additive mask (0 allowed, MASK_VALUE blocked; (batch, 1, 1 or seq, seq)) as flash
    attention's attn_mask: uint8 (batch, 1, queries, keys), 1 where a position is discarded."""

    def __init__(self):
        super().__init__()
        self.less = ops.Less()
        self.cast = ops.Cast()

    def construct(self, mask, batch, queries, keys):
        blocked = self.cast(self.less(mask, -1.0), mstype.uint8)
        return ops.broadcast_to(blocked, (batch, 1, queries, keys))


class FlashAttentionCore(nn.Cell):
    """AttentionCore (without attention dropout) as one FlashAttentionScore in the BSH layout; q/k/v cast
    to the compute dtype, the output back to the input's."""

    def __init__(self, heads: int, head_dim: int, compute: str):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.dtype = DTYPES[compute]
        self.flash = FlashAttentionScore(head_num=heads, scale_value=head_dim ** -0.5, input_layout="BSH")
        self.blocked = BlockedPositions()
        self.cast = ops.Cast()

    def construct(self, q, k, v, mask=None):
        dtype = q.dtype
        q, k, v = self.cast(q, self.dtype), self.cast(k, self.dtype), self.cast(v, self.dtype)
        blocked = None if mask is None else self.blocked(mask, q.shape[0], q.shape[1], k.shape[1])
        out = self.flash(q, k, v, attn_mask=blocked)[3]  # (softmax max, sum, out, attention output)
        return self.cast(out, dtype)

    def standard(self):
        return AttentionCore(self.heads, self.head_dim)
