"""The one Transformer block (and stack) behind every encoder and the fusion model.

A block is attention + MLP with residuals, either pre-LN (ViT, Whisper: x + f(norm(x))) or post-LN
(BERT: norm(x + f(x))), with optional LayerScale (per-channel learned residual gains, CaiT/DINOv2)
and dropout on both residual branches. The mask is whatever additive mask the caller built
(padding, prefix-LM, segments; see masks.py), so one block serves all of them.
"""
import numpy as np

from mindspore import Parameter, Tensor, nn, ops

from .activation import BiasActivation, create_activation
from .attention import MultiHeadAttention
from .linear import dense
from .norm import create_norm


class MLP(nn.Cell):
    """(…, width) -> fc1 (hidden) -> activation -> fc2 -> (…, width); blocks pass
    hidden = round(width * mlp_ratio), so a pruned FFN of m channels is mlp_ratio = m / width.
    fc1's bias is added by the activation cell (BiasActivation), where a fused kernel can take it.

    gated (Llama, Qwen2, Gemma): fc2(act(gate(x)) * fc1(x)), fc1 the "up" and fc2 the "down" projection;
    `bias` False drops every bias (the decoders have none)."""

    def __init__(self, width: int, hidden: int, activation: str = "gelu", dropout: float = 0.0,
                 gated: bool = False, bias: bool = True):
        super().__init__()
        self.gated = gated
        self.fc1 = dense(width, hidden, bias)
        if gated:
            self.gate = dense(width, hidden, bias)
            self.act = create_activation(activation)
            self.mul = ops.Mul()
        else:
            if not bias:
                raise ValueError("MLP: a plain (not gated) MLP keeps fc1's bias (its activation cell adds it)")
            self.act = BiasActivation(activation)
        self.fc2 = dense(hidden, width, bias)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()

    def construct(self, x):
        if self.gated:
            return self.fc2(self.dropout(self.mul(self.act(self.gate(x)), self.fc1(x))))
        return self.fc2(self.dropout(self.act(self.fc1.project(x), self.fc1.bias)))

    def wide(self, x):
        """construct for the rows of a wide decode step (cells.linear's docstring): a gated MLP of float layers
        keeps its hidden activations as columns from one product to the next, one transpose back; others as
        construct."""
        if not (self.gated and self.fc1.WEIGHT_FIRST):
            return self.construct(x)
        leading = x.shape[:-1]
        rows = self.reshape(x, (-1, x.shape[-1]))
        hidden = self.mul(self.act(self.gate.columns(rows)), self.fc1.columns(rows))  # (hidden, rows)
        y = self.transpose(self.fc2.columns(hidden, transposed=True), (1, 0))
        return self.reshape(y, leading + (y.shape[-1],))


class LayerScale(nn.Cell):
    """Multiplies a residual branch by a learned per-channel gain `gamma` (width,), initialised small."""

    def __init__(self, width: int, init_value: float):
        super().__init__()
        self.gamma = Parameter(Tensor(np.full(width, init_value, np.float32)), name="gamma")
        self.mul = ops.Mul()

    def construct(self, x):
        return self.mul(x, self.gamma)


class TransformerBlock(nn.Cell):
    """x (batch, seq, width), additive mask or None -> (batch, seq, width).

    Children (and so checkpoint keys): norm1, attn, norm2, mlp, and ls1/ls2 (`.gamma`) when
    layer_scale > 0. head_dim 0: width // heads (see MultiHeadAttention).

    Decoder options (a DecoderConfig's): `norm` "rms", grouped-query `kv_heads`, `qk_norm`, `gated_mlp`,
    biases off, the attention `scale`, and `sandwich_norm` (Gemma 2/3: post_attn_norm and post_mlp_norm
    on each branch's output before its residual add). With `rotary` the block's construct takes (cos, sin)
    at call time and rotates q and k by them;
    `construct_keys` and `construct_cached` are the prefill and the decode step of generation.
    """

    def __init__(self, width: int, heads: int, mlp_ratio: float = 4.0, pre_norm: bool = True,
                 activation: str = "gelu", layer_scale: float = 0.0, norm_eps: float = 1e-6,
                 dropout: float = 0.0, lora_rank: int = 0, lora_alpha: float = 16.0, head_dim: int = 0,
                 norm: str = "layer", kv_heads: int = 0, qk_norm: bool = False, gated_mlp: bool = False,
                 sandwich_norm: bool = False, attention_bias: bool = True, output_bias: bool = True,
                 mlp_bias: bool = True, attention_scale: float = 0.0, rotary: bool = False):
        super().__init__()
        self.pre_norm = pre_norm
        self.sandwich_norm = sandwich_norm
        self.norm1 = create_norm(width, norm_eps, norm)
        self.attn = MultiHeadAttention(width, heads, dropout, lora_rank, lora_alpha, head_dim, kv_heads, qk_norm,
                                       norm_eps, attention_bias, output_bias, attention_scale, rotary)
        self.norm2 = create_norm(width, norm_eps, norm)
        self.mlp = MLP(width, int(round(width * mlp_ratio)), activation, dropout, gated_mlp, mlp_bias)
        if sandwich_norm:
            self.post_attn_norm = create_norm(width, norm_eps, norm)
            self.post_mlp_norm = create_norm(width, norm_eps, norm)
        if layer_scale > 0:
            self.ls1 = LayerScale(width, layer_scale)
            self.ls2 = LayerScale(width, layer_scale)
        else:
            self.ls1 = nn.Identity()
            self.ls2 = nn.Identity()
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.add = ops.Add()
        # generation's steps and prefills as one CPU kernel: cells.kernels swaps in FusedDecodeStep where it can
        self.insert_child_to_cell("fused_step", None)

    def _attention_residual(self, x, attended):
        if self.sandwich_norm:
            attended = self.post_attn_norm(attended)
        return self.add(x, self.ls1(self.dropout(attended)))

    def _mlp_residual(self, x, wide: bool = False):
        out = self.mlp.wide(self.norm2(x)) if wide else self.mlp(self.norm2(x))
        if self.sandwich_norm:
            out = self.post_mlp_norm(out)
        return self.add(x, self.ls2(self.dropout(out)))

    def construct(self, x, mask=None, rotary=None):
        if self.pre_norm:
            return self._mlp_residual(self._attention_residual(x, self.attn(self.norm1(x), mask, rotary)))
        x = self.norm1(self.add(x, self.ls1(self.dropout(self.attn(x, mask, rotary)))))
        return self.norm2(self.add(x, self.ls2(self.dropout(self.mlp(x)))))

    def construct_keys(self, x, mask, rotary, wide: bool = False):
        """A pre-norm block's `construct` that also returns the attention's keys and values (a prefill); wide: as
        construct_cached's. Not training, a fused step (cells.kernels) runs it as one kernel."""
        if self.fused_step is not None and not self.training:
            return self.fused_step.prefill(x, mask, rotary, self.step_tensors())
        attended, k, v = self.attn.construct_keys(self.norm1(x), mask, rotary, wide)
        return self._mlp_residual(self._attention_residual(x, attended), wide), k, v

    def construct_cached(self, x, mask, rotary, cache_k, cache_v, slots, wide: bool = False, beside: bool = False):
        """A pre-norm block's decode step against its caches (MultiHeadAttention.construct_cached); wide: its
        products as a wide step's (cells.linear's docstring); beside: the caches read, the new rows returned (by the
        fused step's one kernel where cells.kernels swapped it in)."""
        if beside and self.fused_step is not None:
            return self.fused_step(x, mask, rotary, cache_k, cache_v, self.step_tensors())
        attended, cache_k, cache_v = self.attn.construct_cached(self.norm1(x), mask, rotary, cache_k, cache_v, slots,
                                                                wide, beside)
        return self._mlp_residual(self._attention_residual(x, attended), wide), cache_k, cache_v

    def step_tensors(self):
        """Every weight of a decoder block's decode step, in the order the fused step reads them
        (cells/kernels/decoder_step.cc)."""
        attn, mlp = self.attn, self.mlp
        tensors = (self.norm1.weight,)
        if attn.qk_norm:
            tensors = tensors + (attn.q_norm.weight, attn.k_norm.weight)
        tensors = (tensors + attn.q_proj.step_tensors() + attn.k_proj.step_tensors() + attn.v_proj.step_tensors()
                   + attn.out_proj.step_tensors())
        if self.sandwich_norm:
            tensors = tensors + (self.post_attn_norm.weight,)
        tensors = tensors + (self.norm2.weight,) + mlp.gate.step_tensors() + mlp.fc1.step_tensors() + mlp.fc2.step_tensors()
        if self.sandwich_norm:
            tensors = tensors + (self.post_mlp_norm.weight,)
        return tensors


class TransformerStack(nn.Cell):
    """`cfg.layers` blocks (`blocks.0`, `blocks.1`, …) and, for pre-LN stacks, a final `norm`.

    cfg: an EncoderConfig (width, layers, heads, mlp_ratio, pre_norm, activation, layer_scale,
    norm_eps, lora_rank, lora_alpha). x (batch, seq, width), additive mask or None -> (batch, seq, width).
    """

    def __init__(self, cfg, dropout: float = 0.0):
        super().__init__()
        self.width = cfg.width
        self.blocks = nn.CellList([
            TransformerBlock(cfg.width, cfg.heads, cfg.mlp_ratio, cfg.pre_norm, cfg.activation,
                             cfg.layer_scale, cfg.norm_eps, dropout, cfg.lora_rank, cfg.lora_alpha, cfg.head_dim)
            for _ in range(cfg.layers)
        ])
        # Post-LN blocks already end in a norm; pre-LN stacks need one on the way out.
        self.norm = create_norm(cfg.width, cfg.norm_eps) if cfg.pre_norm else nn.Identity()

    # Block indices whose outputs `construct_tapped` returns (feature distillation). A Python attribute:
    # graph mode compiles it as a constant, so set it before the first call of a graph that uses it.
    taps = ()

    def construct(self, x, mask=None):
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)

    def construct_tapped(self, x, mask=None):
        """`construct` that also returns the outputs of the blocks in `taps` (before the final norm), in
        `taps` order: (output, (len(taps), batch, seq, width))."""
        states = ()
        for block in self.blocks:
            x = block(x, mask)
            states = states + (x,)
        tapped = ()
        for index in self.taps:
            tapped = tapped + (states[index],)
        return self.norm(x), ops.stack(tapped)
