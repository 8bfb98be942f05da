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
from .norm import RMSNorm
from .rotary import RotateHalf

__all__ = ["AttentionCore", "MultiHeadAttention", "MASK_VALUE"]


class AttentionCore(nn.Cell):
    """softmax(scale * Q K^T + mask) V over `heads` heads, from and to (batch, seq, heads * head_dim)
    projections: the part a fused kernel (cells/kernels: AOT on CPU, flash attention on Ascend) replaces
    whole. The head split and merge are transposes here; fused kernels read the heads in place.

    kv_heads < heads is grouped-query attention: keys and values (batch, kv_seq, kv_heads * head_dim) serve
    heads // kv_heads query heads each (head h reads kv head h // group, as Hugging Face's repeat_kv), computed
    as one batched product per kv head over its group's query rows, without copying the keys. The keys may be
    longer than the queries (a decode step against its cache). scale 0: head_dim ** -0.5."""

    def __init__(self, heads: int, head_dim: int, dropout: float = 0.0, kv_heads: int = 0, scale: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.kv_heads = kv_heads or heads
        self.group = heads // self.kv_heads
        self.dropout = dropout
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.tile = ops.Tile()
        self.qk_matmul = ops.BatchMatMul(transpose_b=True)
        self.av_matmul = ops.BatchMatMul()
        self.concat_keys = ops.Concat(axis=-1)  # beside: the cache's scores and the step's own
        self.softmax = ScaledMaskedSoftmax(scale or 1.0 / math.sqrt(head_dim))
        self.attn_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def _split_heads(self, x, batch, seq, heads):
        if heads == 1:  # one (kv) head: the layout is already (batch, 1, seq, head_dim); a transpose would copy
            return self.reshape(x, (batch, 1, seq, self.head_dim))  # every key of a decode step's whole cache
        x = self.reshape(x, (batch, seq, heads, self.head_dim))  # (batch, seq, heads, head_dim)
        return self.transpose(x, (0, 2, 1, 3))  # (batch, heads, seq, head_dim)

    def _grouped(self, q, batch, seq, mask):
        """q as (batch, kv_heads, group * seq, head_dim) (each kv head's query rows, group-major; (batch, heads,
        seq, head_dim) without groups) and the mask tiled to those rows."""
        if self.group == 1:
            return self._split_heads(q, batch, seq, self.heads), mask
        q = self.transpose(self.reshape(q, (batch, seq, self.kv_heads, self.group, self.head_dim)), (0, 2, 3, 1, 4))
        q = self.reshape(q, (batch, self.kv_heads, self.group * seq, self.head_dim))
        if mask is not None and mask.shape[2] > 1:
            mask = self.tile(mask, (1, 1, self.group, 1))
        return q, mask

    def _merged(self, out, batch, seq):
        """The heads' outputs (as _grouped laid the queries out) back to (batch, seq, heads * head_dim)."""
        if self.group == 1:  # (batch, heads, seq, head_dim)
            return self.reshape(self.transpose(out, (0, 2, 1, 3)), (batch, seq, self.heads * self.head_dim))
        out = self.reshape(out, (batch, self.kv_heads, self.group, seq, self.head_dim))
        return self.reshape(self.transpose(out, (0, 3, 1, 2, 4)), (batch, seq, self.heads * self.head_dim))

    def construct(self, q, k, v, mask=None):
        batch, seq, kv_seq = q.shape[0], q.shape[1], k.shape[1]
        k, v = self._split_heads(k, batch, kv_seq, self.kv_heads), self._split_heads(v, batch, kv_seq, self.kv_heads)
        q, mask = self._grouped(q, batch, seq, mask)
        probs = self.attn_dropout(self.softmax(self.qk_matmul(q, k), mask))
        return self._merged(self.av_matmul(probs, v), batch, seq)

    def beside(self, q, k, v, own_k, own_v, mask):
        """`construct` of one step, q (batch, 1, heads * head_dim), whose own key and value (batch, 1, kv_heads *
        head_dim) are not in k, v (its cache, only read): the scores against the cache and against itself
        under one softmax, so the step writes no cache (writing one copied it whole: 36 copies of 12.6 MB for a
        16-row step of Gemma 3 270M). mask: the cache's (batch, 1, 1, cache_len), the step's own slot blocked.
        With one kv head the cache is read as it lies, (batch, cache_len, head_dim), every query head a row of
        one product: reshaping a graph's input copies it."""
        batch, kv_seq = q.shape[0], k.shape[1]
        if self.kv_heads == 1:
            q = self.reshape(q, (batch, self.heads, self.head_dim))
            mask = self.reshape(mask, (batch, 1, kv_seq))
        else:
            k, v = (self._split_heads(k, batch, kv_seq, self.kv_heads),
                    self._split_heads(v, batch, kv_seq, self.kv_heads))
            own_k, own_v = self._split_heads(own_k, batch, 1, self.kv_heads), self._split_heads(own_v, batch, 1,
                                                                                                self.kv_heads)
            q, _ = self._grouped(q, batch, 1, None)
        scores = self.concat_keys((self.qk_matmul(q, k), self.qk_matmul(q, own_k)))
        probs = self.softmax(scores, self.concat_keys((mask, ops.zeros_like(mask[..., :1]))))
        out = self.av_matmul(probs[..., :kv_seq], v) + self.av_matmul(probs[..., kv_seq:], own_v)
        if self.kv_heads == 1:
            return self.reshape(out, (batch, 1, self.heads * self.head_dim))
        return self._merged(out, batch, 1)

    def extend_repr(self):
        return f"heads={self.heads}, head_dim={self.head_dim}, kv_heads={self.kv_heads}"


class MultiHeadAttention(nn.Cell):
    """q/k/v projections, the attention core over `heads` heads, then an output projection.

    x: (batch, seq, width) float32; mask: additive float broadcastable to (batch, heads, seq, seq),
    usually (batch, 1, 1, seq) or (batch, 1, seq, seq) with 0 allowed / MASK_VALUE blocked, or None.
    Returns (batch, seq, width).

    head_dim 0 takes width // heads (width must divide); > 0 sets it, so the attention's inner width
    heads * head_dim may differ from width: a model whose heads were pruned (mindvl.train.prune) keeps
    its head size with fewer heads. q/k/v project width -> heads * head_dim, out_proj projects back.

    Decoder options: kv_heads (grouped-query attention: k and v project to kv_heads * head_dim), qk_norm
    (RMSNorm over each head's dimensions of q and k, Gemma 3), `bias` on q/k/v and `out_bias` on the output
    projection, `scale` (0: head_dim ** -0.5), and `rotary` (q and k rotated by the (cos, sin) from
    cells.rotary that construct then takes at call time).
    `construct_cached` is one decode step against a key/value cache.
    """

    def __init__(self, width: int, heads: int, dropout: float = 0.0, lora_rank: int = 0, lora_alpha: float = 16.0,
                 head_dim: int = 0, kv_heads: int = 0, qk_norm: bool = False, norm_eps: float = 1e-6,
                 bias: bool = True, out_bias: bool = True, scale: float = 0.0, rotary: bool = False):
        super().__init__()
        if head_dim < 0:
            raise ValueError(f"attention head_dim: expected 0 (width // heads) or a positive size, got {head_dim}")
        if not head_dim and width % heads:
            raise ValueError(f"attention width {width} is not divisible by heads={heads}")
        if kv_heads and heads % kv_heads:
            raise ValueError(f"attention kv_heads={kv_heads} does not divide heads={heads}")
        self.width = width
        self.heads = heads
        self.head_dim = head_dim or width // heads
        self.kv_heads = kv_heads or heads
        self.inner_width = heads * self.head_dim
        inner, kv_inner = self.inner_width, self.kv_heads * self.head_dim
        self.q_proj = dense(width, inner, bias, lora_rank=lora_rank, lora_alpha=lora_alpha)  # LoRA on q and v, as
        self.k_proj = dense(width, kv_inner, bias)
        self.v_proj = dense(width, kv_inner, bias, lora_rank=lora_rank, lora_alpha=lora_alpha)  # the LoRA paper does
        self.out_proj = dense(inner, width, out_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, norm_eps)
            self.k_norm = RMSNorm(self.head_dim, norm_eps)
        self.rotary = rotary
        if rotary:
            self.rotate = RotateHalf(self.head_dim)
        self.reshape = ops.Reshape()
        self.select = ops.Select()
        # a decode step's key and value into its cache row: 0.65 ms against a Select over the whole cache's 3.4
        # at (16, 768, 256) (export/lite2_folder.py gives Lite 2.0, which cannot build it, a Select instead)
        self.write_rows = ops.TensorScatterUpdate()
        self.slot_matmul = ops.BatchMatMul()  # several steps' keys and values into theirs
        self.reduce_any = ops.ReduceAny(keep_dims=True)
        self.cast = ops.Cast()
        self.core = AttentionCore(heads, self.head_dim, dropout, self.kv_heads, scale)

    def _heads(self, x, heads, norm, rotary):
        """(batch, seq, heads * head_dim) through the per-head norm and the rotation, same shape back."""
        if not self.qk_norm and rotary is None:
            return x
        batch, seq = x.shape[0], x.shape[1]
        x = self.reshape(x, (batch, seq, heads, self.head_dim))
        if self.qk_norm:
            x = norm(x)
        if rotary is not None:
            if not self.rotary:
                raise ValueError("attention: (cos, sin) given to an attention built without rotary=True")
            x = self.rotate(x, rotary[0], rotary[1])
        return self.reshape(x, (batch, seq, heads * self.head_dim))

    def project(self, x, rotary=None, wide: bool = False):
        """(q, k, v) of x, the per-head norms and the rotation applied to q and k; wide: a wide decode step's
        products (cells.linear's docstring)."""
        q, k, v = (self.q_proj.wide(x), self.k_proj.wide(x), self.v_proj.wide(x)) if wide else \
            (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = self._heads(q, self.heads, self.q_norm if self.qk_norm else None, rotary)
        k = self._heads(k, self.kv_heads, self.k_norm if self.qk_norm else None, rotary)
        return q, k, v

    def construct(self, x, mask=None, rotary=None):
        q, k, v = self.project(x, rotary)
        return self.out_proj(self.core(q, k, v, mask))

    def construct_keys(self, x, mask=None, rotary=None, wide: bool = False):
        """`construct` that also returns its keys and values (batch, seq, kv_heads * head_dim): a prefill; wide:
        see `project`."""
        q, k, v = self.project(x, rotary, wide)
        attended = self.core(q, k, v, mask)
        return (self.out_proj.wide(attended) if wide else self.out_proj(attended)), k, v

    def construct_cached(self, x, mask, rotary, cache_k, cache_v, slots, wide: bool = False, beside: bool = False):
        """x (batch, steps, width): each step's key and value written into the caches (batch, cache_len, kv_heads *
        head_dim) at its slot, then attended against the whole cache under `mask` (batch, 1, steps, cache_len).
        slots: (where (batch, cache_len, steps) bool, one true per step; at (batch, steps, 2) int32, each step's
        (row, slot)). Returns (output, cache_k, cache_v) with the steps' keys and values in place. wide: see
        `project`. beside (one step, an AttentionCore): the caches are only read, the step attends to them beside
        its own key (AttentionCore.beside; `mask` then blocks the step's own slot) and returns its new key and
        value rows (batch, 1, kv_heads * head_dim) for the caller to write (engine.decode_loop)."""
        q, k, v = self.project(x, rotary, wide)
        if beside:
            attended = self.core.beside(q, cache_k, cache_v, k, v, mask)
            return (self.out_proj.wide(attended) if wide else self.out_proj(attended)), k, v
        cache_k = self._write(cache_k, k, slots)
        cache_v = self._write(cache_v, v, slots)
        attended = self.core(q, cache_k, cache_v, mask)
        return (self.out_proj.wide(attended) if wide else self.out_proj(attended)), cache_k, cache_v

    def _write(self, cache, new, slots):
        """cache with new (batch, steps, kv) at the slots: one step's row scattered; several by a one-hot product
        (the slots are distinct, so each cache row takes at most one step's row; a slot past the cache, which a
        verification's unused steps may reach, writes nothing)."""
        where, at = slots
        if where.shape[2] == 1:
            return self.write_rows(cache, at, new)
        written = self.slot_matmul(self.cast(where, new.dtype), new)
        return self.select(self.reduce_any(where, 2), written, cache)

    def extend_repr(self):
        return f"width={self.width}, heads={self.heads}, head_dim={self.head_dim}, kv_heads={self.kv_heads}"
