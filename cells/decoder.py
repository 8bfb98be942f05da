"""A decoder-only language model (Gemma 3, Llama, Qwen2 are DecoderConfig settings) built from the one block
family (cells/transformer.py), in three graphs' worth of entry points:

  construct(ids, valid)              every position's logits (parity, training)
  prefill(ids, valid)                the last position's logits and the key/value caches, cache_len long
  decode(token, position, slot, slot_valid, cache_k, cache_v)
                                     one token per sequence against the caches: logits and the caches (each
                                     sequence writes at its own cache slot, so sequences that started at
                                     different times decode in one batch: continuous batching)

and the pieces a multimodal model (cells/multimodal_lm.py) composes: embed_tokens (into which it writes its
image and audio tokens), packed_states (rows of several sequences, each masked and positioned alone),
logits_at (the LM head at chosen positions only) and prefill_embedded.

Prompts of a batch are left-padded (`valid` False on the padding), so a batch prefilled together writes its
next tokens at the same cache slot; the slot is a per-sequence tensor, so one decode graph serves every step
and sequences of different ages share it. Positions count the valid
tokens only, so a padded prompt is rotated and masked exactly as it is alone. The caches are explicit
inputs and outputs, a tuple per layer of (batch, cache_len, kv_heads * head_dim) float32 (one stacked tensor
cost a 1.2 ms slice per layer and step: 43 of Gemma 3's 102 ms), so the same graphs export to MindIR and
run on Lite.
"""
from mindspore import Parameter, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import Normal, initializer

from .attention import AttentionCore
from .graph_entry import GraphEntry
from .masks import MASK_VALUE
from .norm import create_norm
from .rotary import Rotary, sectioned_rotary
from .transformer import TransformerBlock


# prompt buckets of at most this many tokens prefill with the wide products (cells.linear's docstring): Gemma 3
# 270M's prefill of 16 / 32 / 64 / 96 / 128 tokens took 165 / 158 / 200 / 219 / 284 ms plain, 91 / 114 / 167 / 220 /
# 282 ms wide
WIDE_PREFILL = 64


def decoder_block(cfg) -> TransformerBlock:
    """One pre-norm decoder block of a DecoderConfig."""
    return TransformerBlock(cfg.width, cfg.heads, cfg.mlp_ratio, True, cfg.activation, 0.0, cfg.norm_eps, 0.0,
                            cfg.lora_rank, cfg.lora_alpha, cfg.head_dim, cfg.norm, cfg.kv_heads, cfg.qk_norm,
                            cfg.gated_mlp, cfg.sandwich_norm, cfg.attention_bias, cfg.output_bias, cfg.mlp_bias,
                            cfg.attention_scale, rotary=True)


class CausalLM(nn.Cell):
    """Token embedding (`embed.weight`, (vocab, width), times cfg.embed_scale), `blocks.N`, a final `norm` and
    the LM head: the embedding itself when cfg.tie_embeddings (a MatMul with transpose_b, which reads the
    matrix in place: a transposed copy of Gemma's 671 MB embedding cost 3 s a step), else `lm_head.weight`.

    cache_len: the cache length prefill writes and decode reads (prompt bucket + new tokens at most)."""

    def __init__(self, cfg, cache_len: int = 0):
        super().__init__()
        self.cfg = cfg
        self.width = cfg.width
        self.layers = cfg.layers
        self.cache_len = cache_len
        self.head_dim = cfg.head_dim or cfg.width // cfg.heads
        self.kv_width = (cfg.kv_heads or cfg.heads) * self.head_dim
        self.window = cfg.sliding_window
        self.local = tuple(cfg.layer_is_local(i) for i in range(cfg.layers))
        self.embed = nn.Cell()
        self.embed.weight = Parameter(initializer(Normal(0.02), (cfg.vocab_size, cfg.width)), name="weight")
        self.embed_scale = float(cfg.embed_scale)
        self.blocks = nn.CellList([decoder_block(cfg) for _ in range(cfg.layers)])
        self.norm = create_norm(cfg.width, cfg.norm_eps, cfg.norm)
        self.tied = cfg.tie_embeddings
        if not self.tied:
            self.lm_head = nn.Cell()
            self.lm_head.weight = Parameter(initializer(Normal(0.02), (cfg.vocab_size, cfg.width)), name="weight")
        self.quantized_table = False  # use_quantized_tables sets it
        self.position_axes = len(cfg.mrope_section) or 1
        if cfg.mrope_section:  # M-RoPE: positions (batch, seq, 3); 1-D positions are broadcast to the three axes
            self.rotary_global = sectioned_rotary(self.head_dim, cfg.rope_theta, cfg.mrope_section)
            self.rotary_local = sectioned_rotary(self.head_dim, cfg.local_rope_theta or cfg.rope_theta,
                                                 cfg.mrope_section)
        else:
            self.rotary_global = Rotary(self.head_dim, cfg.rope_theta)
            self.rotary_local = Rotary(self.head_dim, cfg.local_rope_theta or cfg.rope_theta)
        self.gather = ops.Gather()
        self.head_matmul = ops.MatMul(transpose_b=True)
        self.mul = ops.Mul()
        self.cast = ops.Cast()
        self.reshape = ops.Reshape()
        self.cumsum = ops.CumSum()
        self.relu = ops.ReLU()
        self.logical_and = ops.LogicalAnd()
        self.select = ops.Select()
        self.concat = ops.Concat(axis=1)
        self.expand = ops.ExpandDims()
        self.concat_last = ops.Concat(axis=-1)

    def use_quantized_tables(self, embed, lm_head=None) -> None:
        """Replace the token table (and an untied head) by quantized layers of (vocab, width) rows
        (cells.quant.QuantizedLinear): embedding lookups widen the rows they gather, the head is the layer's
        product (cells/quantize.py calls this)."""
        self.embed = embed
        if not self.tied:
            self.lm_head = lm_head
        self.quantized_table = True

    # ------------------------------------------------------------------ pieces shared by the entry points

    def _logits(self, hidden):
        """(rows, width) -> (rows, vocab)."""
        head = self.embed if self.tied else self.lm_head
        if self.quantized_table:
            return head.project(hidden)
        return self.head_matmul(hidden, head.weight)

    def _additive(self, allowed):
        zeros = ops.zeros(allowed.shape, mstype.float32)
        return self.select(allowed, zeros, zeros + MASK_VALUE)

    def _masks(self, valid):
        """(global, local) additive masks (batch, 1, seq, seq) of left-padded sequences: a query sees the valid
        keys at or before it, and a local layer's query only the last `window` of them."""
        return self._causal_masks(self.expand(valid, 1))

    def _causal_masks(self, seen):
        """seen: bool (batch, 1 or seq, seq), the keys a query may see at all -> (global, local) additive masks
        (batch, 1, seq, seq): of those, the keys at or before the query; for a local layer only the last
        `window` of them."""
        seq = seen.shape[-1]
        rows = ops.arange(seq).reshape(seq, 1)
        cols = ops.arange(seq).reshape(1, seq)
        causal = self.logical_and(cols <= rows, seen)  # (batch, seq, seq)
        local = self.logical_and(causal, cols > rows - self.window) if self.window else causal
        return self._additive(self.expand(causal, 1)), self._additive(self.expand(local, 1))

    def _positions(self, valid):
        """The index of each token among its sequence's valid tokens (padding at 0)."""
        return self.relu(self.cumsum(self.cast(valid, mstype.int32), 1) - 1)

    def _rotaries(self, positions):
        """(cos, sin) of the global and local layers; positions (batch, seq), or (batch, seq, 3) for M-RoPE, where
        1-D positions mean the same place on every axis (text)."""
        if self.position_axes > 1 and len(positions.shape) == 2:
            positions = ops.tile(self.expand(positions, 2), (1, 1, self.position_axes))
        return self.rotary_global(positions), self.rotary_local(positions)

    def _packed_masks(self, segment):
        """`_causal_masks` of packed rows: a query sees the keys of its own segment (segment > 0). A padding
        query sees nothing (its state is garbage and never read)."""
        keys = self.expand(segment, 1)  # (rows, 1, seq)
        return self._causal_masks(self.logical_and(keys == self.expand(segment, 2), keys > 0))

    def _run(self, x, global_mask, local_mask, positions, wide: bool = False):
        """Embedded tokens through the blocks and the final norm -> (states, every layer's keys, values)."""
        global_rotary, local_rotary = self._rotaries(positions)
        keys, values = (), ()
        for index, block in enumerate(self.blocks):
            local = self.local[index]
            x, k, v = block.construct_keys(x, local_mask if local else global_mask,
                                           local_rotary if local else global_rotary, wide)
            keys, values = keys + (k,), values + (v,)
        return self.norm(x), keys, values

    def _hidden(self, x, valid, positions=None, wide: bool = False):
        global_mask, local_mask = self._masks(valid)
        return self._run(x, global_mask, local_mask, self._positions(valid) if positions is None else positions,
                         wide)

    # ------------------------------------------------------------------ what a multimodal model builds on

    def embed_tokens(self, ids):
        """ids (..., seq) int32 -> their scaled embeddings (..., seq, width): the decoder's input, into which a
        multimodal model writes its projected image and audio tokens."""
        rows = self.embed.rows(ids) if self.quantized_table else self.gather(self.embed.weight, ids, 0)
        return self.mul(rows, self.embed_scale)

    def packed_states(self, x, segment, positions):
        """Embedded packed rows x (rows, seq, width), segment (rows, seq) int32 (1, 2, ... per sequence, 0 at
        padding), positions (rows, seq) int32 (restarting at 0 per sequence) -> the final norm's states
        (rows, seq, width); each sequence computes exactly what it computes alone."""
        global_mask, local_mask = self._packed_masks(segment)
        states, _, _ = self._run(x, global_mask, local_mask, positions)
        return states

    def logits_at(self, states, index):
        """states (rows, seq, width) and flattened positions index (n,) int32 -> logits (n, vocab): the LM
        head only where a loss or a sample reads it (over every position of a 262k vocabulary it costs a
        float32 copy of the logits per token)."""
        flat = self.reshape(states, (-1, self.width))
        return self._logits(self.gather(flat, index, 0))

    # ------------------------------------------------------------------ entry points

    def construct(self, ids, valid):
        """ids (batch, seq) int32, valid (batch, seq) bool -> logits (batch, seq, vocab) float32."""
        hidden, _, _ = self._hidden(self.embed_tokens(ids), valid)
        batch, seq = ids.shape
        return self.reshape(self._logits(self.reshape(hidden, (batch * seq, self.width))), (batch, seq, -1))

    def logits_embedded(self, x, valid, positions):
        """Every position's logits (batch, seq, vocab) of embedded sequences x (batch, seq, width) at explicit
        positions (batch, seq), or (batch, seq, 3) for M-RoPE (an image's tokens at their grid places)."""
        hidden, _, _ = self._hidden(x, valid, positions)
        batch, seq = valid.shape
        return self.reshape(self._logits(self.reshape(hidden, (batch * seq, self.width))), (batch, seq, -1))

    def prefill(self, ids, valid):
        """-> (last position's logits (batch, vocab), cache_k, cache_v: per layer (batch, cache_len, kv_width)).
        The prompt occupies cache slots 0..seq-1; later slots are zeros for decode to fill."""
        return self.prefill_embedded(self.embed_tokens(ids), valid)

    def prefill_embedded(self, x, valid, positions=None):
        """`prefill` from embedded prompts x (batch, seq, width): a multimodal prompt's image and audio
        tokens already written in; positions (batch, seq, 3) for M-RoPE prompts (None: counted from `valid`). A
        short prompt bucket (WIDE_PREFILL) takes the wide products."""
        batch, seq = valid.shape
        hidden, keys, values = self._hidden(x, valid, positions, seq <= WIDE_PREFILL)
        last = self.reshape(hidden[:, seq - 1:seq, :], (batch, self.width))
        empty = ops.zeros((batch, self.cache_len - seq, self.kv_width), mstype.float32)
        cache_k = tuple(self.concat((k, empty)) for k in keys)
        cache_v = tuple(self.concat((v, empty)) for v in values)
        return self._logits(last), cache_k, cache_v

    def attends_beside(self) -> bool:
        """Whether every layer's attention core can attend beside its cache (AttentionCore.beside; a fused
        attention kernel cannot), so a wide step can leave the caches unwritten."""
        return all(isinstance(block.attn.core, AttentionCore) for block in self.blocks)

    def fused_steps(self) -> bool:
        """Whether a block's decode step runs as one kernel (cells.kernels' FusedDecodeStep), which attends beside
        its cache."""
        return any(block.fused_step is not None for block in self.blocks)

    def decode(self, token, position, slot, slot_valid, cache_k, cache_v, wide: bool = False, beside: bool = False):
        """token (batch, steps) int32: each sequence's next tokens (one at a decode step; several to extend a
        reused prompt prefix or to verify drafted tokens), their positions and the consecutive cache slots they
        are written to (batch, steps) int32, slot_valid (batch, cache_len) bool (the prompt's valid slots, the
        generated ones and these: each of these sees those up to its own slot), caches -> (logits (batch *
        steps, vocab), cache_k, cache_v). wide: the products of a step of many rows (cells.linear's docstring).
        beside (one step; attends_beside()): the caches are only read and each layer returns the step's new key
        and value rows (batch, 1, kv_width) instead, for the caller to write at `slot` (copying every cache to
        write one row cost a 16-row step of Gemma 3 270M 32 of its 160 ms)."""
        x = self.embed_tokens(token)
        slots = ops.arange(self.cache_len).reshape(1, self.cache_len, 1)
        at_slot = slots == self.expand(slot, 1)  # (batch, cache_len, steps): where each step's key goes
        rows = self.cumsum(slot * 0 + 1, 0) - 1  # (batch, steps): each step's row (a dynamic batch too)
        writes = (at_slot, self.concat_last((self.expand(rows, 2), self.expand(slot, 2))))  # and its (row, slot)
        query_slot = self.expand(self.expand(slot, 1), 3)  # (batch, 1, steps, 1)
        key_slots = self.reshape(slots, (1, 1, 1, self.cache_len))
        seen = self.logical_and(self.expand(self.expand(slot_valid, 1), 1),  # beside: its own key is not in the cache
                                query_slot > key_slots if beside else query_slot + 1 > key_slots)
        global_mask = self._additive(seen)  # (batch, 1, steps, cache_len)
        local_mask = (self._additive(self.logical_and(seen, key_slots > query_slot - self.window)) if self.window
                      else global_mask)
        global_rotary, local_rotary = self._rotaries(position)
        keys, values = (), ()
        for index, block in enumerate(self.blocks):
            local = self.local[index]
            x, k, v = block.construct_cached(x, local_mask if local else global_mask,
                                             local_rotary if local else global_rotary,
                                             cache_k[index], cache_v[index], writes, wide, beside)
            keys, values = keys + (k,), values + (v,)
        hidden = self.reshape(self.norm(x), (-1, self.width))
        return self._logits(hidden), keys, values


class Prefill(GraphEntry):
    """CausalLM.prefill as a graph of its own (one per prompt bucket)."""

    def __init__(self, lm: CausalLM):
        super().__init__(auto_prefix=False)
        self.lm = lm

    def construct(self, ids, valid):
        return self.lm.prefill(ids, valid)


class Decode(GraphEntry):
    """CausalLM.decode as a graph of its own (one for every step). The caches come as separate tensors,
    every layer's keys then every layer's values (a tuple argument would be a graph constant, recompiled
    at every step, and separate tensors are what an exported graph's inputs are). wide: the step of many rows
    (engine.package_graphs.WIDE_ROWS or more, cells.linear's docstring), the same weights."""

    def __init__(self, lm: CausalLM, wide: bool = False):
        super().__init__(auto_prefix=False)
        self.lm = lm
        self.layers = lm.layers
        self.wide = wide
        # one step a row: its caches read, its new rows returned (a wide step's, or one the fused steps run)
        self.beside = (wide or lm.fused_steps()) and lm.attends_beside()

    def construct(self, token, position, slot, slot_valid, *caches):
        return self.lm.decode(token, position, slot, slot_valid, caches[:self.layers], caches[self.layers:],
                              self.wide, self.beside and token.shape[1] == 1)
