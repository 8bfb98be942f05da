"""Per-rank memory, communication and step time of a parallel strategy, computed from the config alone.

Nothing is built: parameter counts come from the cells' shapes (cells/*.py), and must equal the built
model's exactly (tests/parallel/test_planner.py). A recipe with a decoder (model.decoder.layers > 0) is
planned as the generative model: vision and audio encoders, projectors and the decoder in the fusion
module's place, over data.packing.length tokens per sample, with its LM head as the heads module (its
weights and logits split over the vocabulary like apply_decoder_strategy's).

The model, per micro-batch of b samples on a rank whose
module runs with (dp_m, mp_m) inside its pipeline stage (s tokens, w width, i = heads x head_dim,
h = FFN width, a heads, c bytes of the compute dtype):

  parameters     float32 master weights (4 B); per block the q/k/v/fc1 weights and biases are column-split
                 and out/fc2 weights row-split over mp (Megatron), norms and out/fc2 biases replicated
                 (a decoder's k/v too when mp does not divide its kv heads); embedding tables split over
                 mp only with vocab_emb_dp false; everything else replicated.
  gradients      4 B per trainable parameter on the rank (frozen parameters have none).
  optimizer      AdamWeightDecay: two float32 moments per trainable parameter (8 B), divided by the shard
                 size (dp, or optimizer_weight_shard_size) with enable_parallel_optimizer.
  activations    kept for backward per block and sample (each op's saved inputs in cells/transformer.py):
                 s (4w + 4i/mp + 2h/mp [+ 2w LayerScale]) c + (a/mp) s^2 c_softmax; a decoder block keeps
                 s (4w [+ 2w sandwich norms] + (2i + 2 kv)/mp + 4h/mp gated) c + the same score term
                 (2 kv whole, not over mp, when its kv heads are replicated).
                 select_recompute drops the s^2 term; recompute keeps only the block input s w c plus one
                 block's full set while it is recomputed. Times b and the in-flight micro-batches of 1F1B:
                 stage k of pp holds min(m, pp - k). Frozen encoders keep none; cached ones do not run.
  FLOPs          forward per block and sample: 2 s (3 w i + i w + 2 w h) + 4 s^2 i; training = 3x forward
                 (+1x with recompute, + the score matmul with select_recompute); frozen encoders 1x; a
                 frozen module that gradients cross (a frozen decoder behind trained projectors) 2x.
  communication  per step and rank: data-parallel gradient all-reduce of the rank's gradient bytes (as
                 reduce-scatter + all-gather with the parallel optimizer); tensor parallel 2 all-reduces
                 forward + 2 backward per block of b s w c bytes (each a reduce-scatter + all-gather);
                 pipeline send + receive of the boundary states per micro-batch, forward and backward.
  time           alpha-beta: a ring collective of M bytes over n ranks costs 2(n-1) alpha + 2 (n-1)/n M / B
                 (half for reduce-scatter or all-gather alone); a stage's micro-batch time is its FLOPs over
                 mp x achieved FLOP/s plus its TP and P2P time; step = (m + pp - 1) x the slowest stage +
                 the data-parallel all-reduce (not overlapped: an upper bound). Bubble (pp - 1)/(m + pp - 1).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mindvl.config import (MODULES, STACKS, AudioConfig, Config, DataConfig, DecoderConfig, TextConfig, VisionConfig,
                           build_dataclass)
from mindvl.errors import ConfigError

from .hardware import Hardware
from .strategy import ParallelStrategy, RecomputeConfig, pipeline_blocks, validate_strategy

ENCODERS = ("vision", "text", "audio")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PARAM_BYTES = 4  # float32 master weights (train.precision keeps parameters float32)
ADAM_STATES = 2  # AdamWeightDecay: moments1, moments2 (float32)
# A recipe whose vocabulary comes from its data set (model.text.vocab_size 0) without the data built is
# planned with this size: easy-VQA's word tokenizer holds a few dozen words plus the special tokens.
PLANNING_VOCAB = 64
# Shapes of the converted encoders (mindvl/pretrained/{dinov2,minilm,whisper}.py, checked equal by the
# tests), used when a recipe names converted folders that are not on this machine: planning needs no weights.
PUBLISHED_ENCODERS = {
    "vision": dict(width=384, layers=12, heads=6, mlp_ratio=4.0, pre_norm=True, layer_scale=1.0,
                   norm_eps=1e-6, patch_size=14),  # DINOv2 ViT-S/14
    "text": dict(width=384, layers=6, heads=12, mlp_ratio=4.0, pre_norm=False, norm_eps=1e-12,
                 max_positions=512, pooling="mean"),  # all-MiniLM-L6-v2
    "audio": dict(width=512, layers=6, heads=8, mlp_ratio=4.0, pre_norm=True, norm_eps=1e-5),  # Whisper base
}
MINILM_VOCAB = 30522 + 2  # MiniLM's WordPiece + [BOS], [EOS] the data's tokenizer appends
# The decoder `mindvl convert llm` writes from the installed Gemma 3 270M GGUF (268,098,176 parameters; the
# tests check it against a converted folder), planned when a recipe's model.pretrained.decoder is absent.
PUBLISHED_DECODER = dict(width=640, layers=18, heads=4, head_dim=256, kv_heads=1, mlp_ratio=3.2, vocab_size=262144,
                         activation="gelu_tanh", norm="rms", norm_eps=1e-6, qk_norm=True, gated_mlp=True,
                         sandwich_norm=True, attention_scale=0.0625, rope_theta=1e6, local_rope_theta=1e4,
                         sliding_window=512, layer_types=(["local"] * 5 + ["global"]) * 3,
                         embed_scale=640 ** 0.5, tie_embeddings=True, max_positions=32768)


# ----------------------------------------------------------------------------- the config as planned

def planning_config(cfg: Config) -> Config:
    """A copy of `cfg` with every shape the model needs known: converted encoders' shapes (from their
    folders when present, else the published ones) and the vocabulary (the data's tokenizer when built,
    else PLANNING_VOCAB, or MiniLM's with a pretrained text encoder)."""
    cfg = copy.deepcopy(cfg)
    model = cfg.model
    kinds = {"vision": VisionConfig, "text": TextConfig, "audio": AudioConfig}
    for kind, cls in kinds.items():
        folder = getattr(model.pretrained, kind)
        if not folder:
            continue
        current = getattr(model, kind)
        shape = None
        if Path(folder, "config.json").is_file():
            try:
                from mindvl.pretrained.store import read_config
                shape = dict(read_config(folder)["encoder"])
            except Exception:  # an unreadable folder: plan with the published shape
                shape = None
        shape = shape or dict(PUBLISHED_ENCODERS[kind])
        shape.update(lora_rank=current.lora_rank, lora_alpha=current.lora_alpha)
        if kind == "text":
            shape["vocab_size"] = current.vocab_size or MINILM_VOCAB
        setattr(model, kind, cls(**shape))
    if model.text.vocab_size <= 0:
        model.text.vocab_size = _data_vocab(cfg.data) or PLANNING_VOCAB
    if model.pretrained.decoder:
        model.decoder = _planned_decoder(Path(model.pretrained.decoder), model.decoder)
    if model.pretrained.vlm and Path(model.pretrained.vlm, "config.json").is_file():
        from mindvl.pretrained.bind import bind_vlm

        try:  # the converted VLM's tower and decoder (planning reads shapes: bind's own reading)
            bind_vlm(cfg, Path(model.pretrained.vlm))
        except ConfigError:
            pass
    if model.generative and model.decoder.vocab_size <= 0:  # a decoder over the data's word tokenizer
        model.decoder.vocab_size = model.text.vocab_size
    return cfg


def _planned_decoder(folder: Path, current: DecoderConfig) -> DecoderConfig:
    """The decoder of a converted LLM folder (its config.json, files not hashed: planning reads shapes only),
    or PUBLISHED_DECODER when the folder is absent or unreadable; the recipe's LoRA settings kept."""
    import json

    shape = dict(PUBLISHED_DECODER)
    try:
        shape = dict(json.loads((folder / "config.json").read_text())["decoder"])
    except (OSError, ValueError, KeyError):
        pass
    shape.update(lora_rank=current.lora_rank, lora_alpha=current.lora_alpha)
    return build_dataclass(DecoderConfig, shape, "model.decoder")


def _data_vocab(data: DataConfig) -> int:
    """The built data set's vocabulary size, or 0 when it is not built."""
    from mindvl.data import load_tokenizer
    from mindvl.errors import DataRootError

    try:
        return int(load_tokenizer(data.root).vocab_size)
    except DataRootError:
        return 0


# ----------------------------------------------------------------------------- shapes, parameters, FLOPs

def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


@dataclass
class StackShape:
    """One Transformer stack as the planner sees it (cells/transformer.py). The defaults are an encoder's
    block; a decoder's (cells/decoder.py) sets the grouped-query, gated, bias-free and RMSNorm options."""
    name: str
    width: int
    inner: int  # heads x head_dim
    hidden: int  # FFN width
    heads: int
    layers: int
    tokens: int  # tokens per sequence through the blocks
    sequences: int  # sequences per sample (text: question and caption)
    pre_norm: bool
    layer_scale: bool
    lora_rank: int
    kv_inner: int = 0  # kv_heads x head_dim of grouped-query attention; 0: inner
    gated: bool = False  # gate and up projections (down(act(gate(x)) * up(x)))
    qkv_bias: bool = True
    out_bias: bool = True  # the attention's output projection
    mlp_bias: bool = True  # fc1 (gate and up) and fc2
    norm_params: int = 0  # parameters of one norm; 0: a LayerNorm's 2 x width
    norms: int = 2  # per block (sandwich norms: 4)
    qk_norm_params: int = 0  # the per-head query and key norms
    kv_heads: int = 0  # of grouped-query attention; 0: heads
    window: int = 0  # tokens a windowed layer's query attends to (a native tower's window row); 0: every token
    windowed_layers: int = 0  # of `layers`, those that attend within windows

    @property
    def span(self) -> float:
        """Keys a query attends to, averaged over the blocks (windowed layers attend within their window)."""
        if not self.window or not self.windowed_layers:
            return float(self.tokens)
        windowed = self.windowed_layers / self.layers
        return windowed * min(self.window, self.tokens) + (1 - windowed) * self.tokens

    @property
    def kv(self) -> int:
        return self.kv_inner or self.inner

    def kv_replicated(self, mp: int) -> bool:
        """Fewer kv heads than mp: k and v are held whole on every rank (apply._decoder_block)."""
        return (self.kv_heads or self.heads) % mp != 0

    @property
    def mlp_inputs(self) -> int:
        """Products from the block's width into the FFN's: gate and up, or fc1."""
        return 2 if self.gated else 1

    def block_params(self, mp: int = 1) -> Tuple[int, int, int]:
        """(split over mp, replicated, LoRA) parameters of one block under model_parallel `mp`."""
        w, i, h, kv, ins = self.width, self.inner, self.hidden, self.kv, self.mlp_inputs
        kv_params = 2 * w * kv + (2 * kv if self.qkv_bias else 0)  # k and v
        split = w * i + i * w + ins * w * h + h * w  # q, out; fc1 (gate, up), fc2 (down)
        split += (i if self.qkv_bias else 0) + (ins * h if self.mlp_bias else 0)
        replicated = self.norms * (self.norm_params or 2 * w) + self.qk_norm_params
        replicated += (w if self.out_bias else 0) + (w if self.mlp_bias else 0) + (2 * w if self.layer_scale else 0)
        if self.kv_replicated(mp):
            replicated += kv_params
        else:
            split += kv_params
        lora = self.lora_rank * ((w + i) + (w + kv)) if self.lora_rank else 0  # on q and v
        return split, replicated, lora

    def block_forward_flops(self) -> float:
        """Forward FLOPs of one block for one sample."""
        s, w, i, h = self.tokens, self.width, self.inner, self.hidden
        products = w * i + 2 * w * self.kv + i * w + (self.mlp_inputs + 1) * w * h
        return self.sequences * (2 * s * products + 4 * s * self.span * i)

    def block_score_flops(self) -> float:
        return self.sequences * 2 * self.tokens * self.span * self.inner

    def block_activation_bytes(self, mp: int, compute: int, softmax: int, recompute: RecomputeConfig) -> float:
        """Bytes one block keeps for backward per sample (see the module docstring)."""
        s, w, i, h, a = self.tokens, self.width, self.inner, self.hidden, self.heads
        if recompute.recompute:
            return self.sequences * s * w * compute
        extra = (2 * w if self.layer_scale else 0) + (self.norms - 2) * w
        kv = 2 * self.kv  # k and v, whole on every rank when replicated
        attention = 2 * i + (0 if self.kv_replicated(mp) else kv)  # q, the weighted sum (and k, v) split over mp
        mlp = 4 * h if self.gated else 2 * h  # gate, up, act(gate), their product; fc1 and act(fc1)
        kept = s * (4 * w + extra + (attention + mlp) / mp + (kv if self.kv_replicated(mp) else 0)) * compute
        if not recompute.select_recompute:
            kept += a / mp * s * self.span * softmax
        return self.sequences * kept

    def full_block_activation_bytes(self, mp: int, compute: int, softmax: int) -> float:
        return self.block_activation_bytes(mp, compute, softmax, RecomputeConfig())


def _decoder_norm_params(dec) -> int:
    """Parameters of one of the decoder's norms: RMSNorm a weight, LayerNorm a weight and a bias."""
    return dec.width if dec.norm == "rms" else 2 * dec.width


def decoder_stack(dec, tokens: int) -> StackShape:
    """The StackShape of a decoder (cells/decoder.py decoder_block) over `tokens` tokens per sample."""
    head_dim = dec.head_dim or dec.width // dec.heads
    return StackShape("fusion", dec.width, dec.heads * head_dim, int(round(dec.width * dec.mlp_ratio)), dec.heads,
                      dec.layers, tokens, 1, True, False, dec.lora_rank,
                      kv_inner=(dec.kv_heads or dec.heads) * head_dim, kv_heads=dec.kv_heads or dec.heads,
                      gated=dec.gated_mlp,
                      qkv_bias=dec.attention_bias, out_bias=dec.output_bias, mlp_bias=dec.mlp_bias,
                      norm_params=_decoder_norm_params(dec), norms=4 if dec.sandwich_norm else 2,
                      qk_norm_params=2 * head_dim if dec.qk_norm else 0)


def decoder_parameters(dec) -> int:
    """Parameters of a CausalLM(dec): blocks, the embedding, the final norm and an untied head."""
    head = 0 if dec.tie_embeddings else dec.vocab_size * dec.width
    blocks = dec.layers * sum(decoder_stack(dec, 1).block_params())
    return blocks + dec.vocab_size * dec.width + _decoder_norm_params(dec) + head


@dataclass
class ModuleShape:
    """A module: its stack (none for the heads), its other parameters and FLOPs, and how it trains."""
    name: str
    stack: Optional[StackShape]
    other_params: int  # non-block parameters, replicated
    table_params: int  # embedding tables (split over mp when vocab_emb_dp is false)
    other_forward_flops: float  # per sample, outside the blocks (patch embedding, convs, in-projections, heads)
    trainable: bool  # its (non-LoRA) weights get gradients
    runs: bool  # False: a frozen encoder whose outputs are cached, never run in training
    output_bytes_per_sample: float = 0.0  # states handed downstream (pipeline boundaries)
    vocabulary_split: bool = False  # its outputs (an LM head's logits) split over mp with vocab_emb_dp false
    # of other_params, the part another train.modules entry governs (a generative model's projectors, which
    # train with "heads"), and whether that part trains
    separate_params: int = 0
    separate_trainable: bool = False
    # gradients flow through its blocks to something trained before them even when none of its own weights
    # train (a frozen decoder behind trained projectors): it keeps activations and runs a backward pass
    backward_through: bool = False
    # its LoRA adapters train while its base weights are frozen (model.pretrained.freeze); train.modules.<m>.frozen
    # fixes them too
    adapters_trainable: bool = True

    @property
    def block_params(self) -> int:
        return sum(self.stack.block_params()) if self.stack else 0

    @property
    def params(self) -> int:
        return self.other_params + self.table_params + (self.stack.layers * self.block_params if self.stack else 0)

    @property
    def trainable_params(self) -> int:
        adapters = self.stack.layers * self.stack.block_params()[2] if self.stack and self.adapters_trainable else 0
        own = self.params - self.separate_params if self.trainable else adapters
        return own + (self.separate_params if self.separate_trainable else 0)

    @property
    def needs_backward(self) -> bool:
        return self.runs and (self.trainable_params > 0 or self.backward_through)


def model_shapes(cfg: Config) -> Dict[str, ModuleShape]:
    """Every module's shape from a planning config (`planning_config`)."""
    m, pre = cfg.model, cfg.preprocess
    held = {name: getattr(cfg.train.modules, name).frozen for name in MODULES}  # adapters included
    frozen = dict(held)  # base weights
    for kind in ENCODERS:
        if getattr(m.pretrained, kind) and m.pretrained.freeze:
            frozen[kind] = True
    if m.pretrained.decoder and m.pretrained.freeze:
        frozen["fusion"] = True  # the converted decoder stands in the fusion module's place
    compute = DTYPE_BYTES[cfg.train.precision.compute]

    def stack(name, enc, tokens, sequences=1):
        inner = enc.heads * (enc.head_dim or enc.width // enc.heads)
        return StackShape(name, enc.width, inner, int(round(enc.width * enc.mlp_ratio)), enc.heads, enc.layers,
                          tokens, sequences, enc.pre_norm, enc.layer_scale > 0, enc.lora_rank)

    def final_norm(enc):
        return 2 * enc.width if enc.pre_norm else 0

    vocab = m.text.vocab_size
    patches = (pre.image_size // m.vision.patch_size) ** 2
    v_tokens, t_tokens, a_tokens = patches + 1, pre.max_text_length, pre.max_audio_frames // 2
    answer = pre.max_answer_length
    fusion_tokens = 1 + v_tokens + t_tokens + a_tokens + answer
    vw, tw, aw, fw = m.vision.width, m.text.width, m.audio.width, m.fusion.width
    p = m.vision.patch_size
    shapes = {}
    cached = bool(m.pretrained.cache)
    shapes["vision"] = ModuleShape(
        "vision", stack("vision", m.vision, v_tokens),
        other_params=_linear(3 * p * p, vw) + vw + v_tokens * vw + final_norm(m.vision), table_params=0,
        other_forward_flops=2 * patches * 3 * p * p * vw, trainable=not frozen["vision"], adapters_trainable=not held["vision"],
        runs=not (frozen["vision"] and cached and not m.vision.lora_rank), output_bytes_per_sample=v_tokens * vw * compute)
    shapes["text"] = ModuleShape(
        "text", stack("text", m.text, t_tokens, sequences=2),
        other_params=2 * tw + 2 * tw + final_norm(m.text), table_params=(vocab + m.text.max_positions) * tw,
        other_forward_flops=0.0, trainable=not frozen["text"], adapters_trainable=not held["text"],
        runs=not (frozen["text"] and cached and not m.text.lora_rank), output_bytes_per_sample=2 * t_tokens * tw * compute)
    frames = pre.max_audio_frames
    shapes["audio"] = ModuleShape(
        "audio", stack("audio", m.audio, a_tokens),
        other_params=_linear(pre.n_mels * 3, aw) + _linear(aw * 3, aw) + final_norm(m.audio), table_params=0,
        other_forward_flops=2 * frames * pre.n_mels * 3 * aw + 2 * a_tokens * 3 * aw * aw,
        trainable=not frozen["audio"], adapters_trainable=not held["audio"], runs=not (frozen["audio"] and cached and not m.audio.lora_rank),
        output_bytes_per_sample=a_tokens * aw * compute)
    shapes["fusion"] = ModuleShape(
        "fusion", stack("fusion", m.fusion, fusion_tokens),
        other_params=_linear(vw, fw) + _linear(tw, fw) + _linear(aw, fw) + 4 * fw + fw + answer * fw
        + final_norm(m.fusion),
        table_params=vocab * fw,
        other_forward_flops=2 * (v_tokens * vw + t_tokens * tw + a_tokens * aw) * fw,
        trainable=not frozen["fusion"], adapters_trainable=not held["fusion"], runs=True,
        output_bytes_per_sample=fusion_tokens * fw * compute)
    if m.is_native:
        return _native_shapes(cfg, frozen, held, compute)
    if m.generative:
        upstream = any(shapes[kind].trainable_params for kind in ("vision", "audio"))
        shapes.update(_generative_shapes(cfg, frozen, not held["fusion"], upstream, compute))
        del shapes["text"]  # the question's text enters the decoder as tokens
        return shapes
    answers = m.num_answers
    heads_params = (vw + tw + aw) * m.embed_dim + 2 + (2 * fw + _linear(fw, answers)) + (2 * fw + _linear(fw, vocab))
    shapes["heads"] = ModuleShape(
        "heads", None, other_params=heads_params, table_params=0,
        other_forward_flops=2 * (vw + 2 * tw + aw) * m.embed_dim + 2 * fw * answers + 2 * answer * fw * vocab,
        trainable=not frozen["heads"], runs=True,
        output_bytes_per_sample=answer * vocab * 4 * 2)  # LM logits and their softmax (float32 loss)
    return shapes


_MEASURED_SIZES: Dict[tuple, Tuple[int, int]] = {}


def conversation_sizes(cfg: Config) -> Tuple[int, int]:
    """(tokens, labelled positions) of one training sample of a generative recipe: the means over the built
    data set's training conversations (of data.conversation_kinds) as the recipe's chat template renders
    them, or a whole packed row of data.packing.length tokens, every one labelled (an upper bound), when the
    data set or the decoder's tokenizer is not on this machine. Measured once per data set and recipe."""
    from mindvl.cells.multimodal_lm import modality_tokens
    from mindvl.chat import recipe_chat
    from mindvl.data.reading.conversation_loader import conversation_rows
    from mindvl.data.reading.conversation_loader import conversation_sizes as rendered_sizes
    from mindvl.errors import DataRootError, InputError

    length = int(cfg.data.packing.length)
    _, _, image_tokens, _, audio_tokens = modality_tokens(cfg.model, cfg.preprocess)
    key = (str(Path(cfg.data.root).resolve()), cfg.model.pretrained.decoder, cfg.model.chat_template, length,
           image_tokens, audio_tokens, tuple(cfg.data.conversation_kinds), float(cfg.data.validation_fraction))
    if key not in _MEASURED_SIZES:
        try:
            sizes = rendered_sizes(cfg, "train", recipe_chat(cfg, image_tokens, audio_tokens))
            rows = sizes.usable(conversation_rows(cfg, "train"), list(cfg.data.conversation_kinds))
            measured = (int(round(sizes.tokens[rows].mean())), max(1, int(round(sizes.labels[rows].mean()))))
        except (ConfigError, DataRootError, InputError, OSError, ValueError):
            measured = (length, length)
        _MEASURED_SIZES[key] = measured if len(measured) == 2 and measured[0] > 0 else (length, length)
    return _MEASURED_SIZES[key]


def _generative_shapes(cfg: Config, frozen: Dict[str, bool], adapters_trainable: bool, encoders_train: bool,
                       compute: int) -> Dict[str, ModuleShape]:
    """The decoder in the fusion module's place and its LM head, for one conversation (conversation_sizes:
    its tokens through the decoder, its labelled positions through the head, which the model runs there
    only). The fusion module also holds the projectors, LLaVA's two-layer MLP from each encoder's pooled
    tokens into the decoder's width, which train with train.modules.heads (as mindvl.train.optim.module_of
    assigns them); the LM head is the decoder's (train.modules.fusion)."""
    from mindvl.cells.multimodal_lm import modality_tokens

    m, dec = cfg.model, cfg.model.decoder
    (tokens, labels), dw = conversation_sizes(cfg), dec.width
    hidden = m.projector.hidden or dw
    projectors = (_linear(m.vision.width, hidden) + _linear(hidden, dw)) + (_linear(m.audio.width, hidden)
                                                                           + _linear(hidden, dw))
    _, _, image_tokens, _, clip_tokens = modality_tokens(m, cfg.preprocess)
    into_decoder = image_tokens * m.vision.width + clip_tokens * m.audio.width  # the projectors' first layers
    return {
        "fusion": ModuleShape(
            "fusion", decoder_stack(dec, tokens), other_params=projectors + _decoder_norm_params(dec),
            table_params=dec.vocab_size * dw,
            other_forward_flops=2 * into_decoder * hidden + 2 * (image_tokens + clip_tokens) * hidden * dw,
            trainable=not frozen["fusion"], runs=True, output_bytes_per_sample=tokens * dw * compute,
            separate_params=projectors, separate_trainable=not frozen["heads"],
            backward_through=not frozen["heads"] or encoders_train, adapters_trainable=adapters_trainable),
        "heads": ModuleShape(
            "heads", None, other_params=0 if dec.tie_embeddings else dec.vocab_size * dw, table_params=0,
            other_forward_flops=2 * labels * dw * dec.vocab_size, trainable=not frozen["fusion"], runs=True,
            output_bytes_per_sample=labels * dec.vocab_size * 4 * 2, vocabulary_split=True),
    }


def _native_shapes(cfg: Config, frozen: Dict[str, bool], held: Dict[str, bool], compute: int) -> Dict[str, ModuleShape]:
    """A native-resolution VLM (model.native: Qwen2.5-ViT-like) for one sample: one image of model.native.
    max_pixels through the tower (its windowed layers attending within a window row), its merged tokens within a
    packed row of data.packing.length tokens through the decoder (every position labelled: an upper bound). The
    merger (the 2-layer MLP projector) is the tower's; no audio, no text encoder."""
    n, dec = cfg.model.native, cfg.model.decoder
    if n.vit:
        raise ConfigError("mindvl plan: a native recipe with a dinov2 tower (model.native.family dinov2, e.g. "
                          "vlm-s-native) is not planned yet; plan the Qwen family's tower (mindvl-8b) or the "
                          "fixed-resolution vlm-s")
    if cfg.model.pretrained.vlm and cfg.model.pretrained.freeze:
        frozen = {**frozen, "vision": True, "fusion": True}
    patches = n.max_pixels // n.patch_size ** 2
    tokens = int(cfg.data.packing.length)
    qwen25 = n.family == "qwen2_5_vl"  # gated MLP, RMSNorm and windows; Qwen2-VL: GELU MLP, LayerNorm, none
    width, merged = n.width, n.width * n.merge ** 2
    norm = width if qwen25 else 2 * width
    tower = StackShape("vision", width, width, n.mlp_width, n.heads, n.layers, patches, 1, True, False, 0,
                       gated=qwen25, norm_params=norm, window=n.window * n.window * n.merge ** 2 if qwen25 else 0,
                       windowed_layers=n.layers - len(n.full_layers) if qwen25 else 0)
    merger = norm + _linear(merged, merged) + _linear(merged, n.out_width)
    vision = ModuleShape(
        "vision", tower, other_params=n.patch_values * width + merger, table_params=0,
        other_forward_flops=2 * patches * n.patch_values * width
        + 2 * patches // n.merge ** 2 * (merged * merged + merged * n.out_width),
        trainable=not frozen["vision"], runs=True, adapters_trainable=not held["vision"],
        output_bytes_per_sample=patches // n.merge ** 2 * n.out_width * compute)
    dw = dec.width
    fusion = ModuleShape(
        "fusion", decoder_stack(dec, tokens), other_params=_decoder_norm_params(dec), table_params=dec.vocab_size * dw,
        other_forward_flops=0.0, trainable=not frozen["fusion"], runs=True, output_bytes_per_sample=tokens * dw * compute,
        backward_through=not frozen["vision"], adapters_trainable=not held["fusion"])
    heads = ModuleShape(
        "heads", None, other_params=0 if dec.tie_embeddings else dec.vocab_size * dw, table_params=0,
        other_forward_flops=2 * tokens * dw * dec.vocab_size, trainable=not frozen["fusion"], runs=True,
        output_bytes_per_sample=tokens * dec.vocab_size * 4 * 2, vocabulary_split=True)
    return {"vision": vision, "fusion": fusion, "heads": heads}


def count_config_parameters(cfg: Config) -> int:
    """Parameters the config builds, counted analytically (no cells: count_cell_parameters counts a built one)."""
    return sum(s.params for s in model_shapes(planning_config(cfg)).values())


def count_config_trainable_parameters(cfg: Config) -> int:
    return sum(s.trainable_params for s in model_shapes(planning_config(cfg)).values())


# ----------------------------------------------------------------------------- pipeline assignment

def block_costs(shapes: Dict[str, ModuleShape], recompute: RecomputeConfig = RecomputeConfig()) -> List[float]:
    """Training FLOPs per sample of each pipeline block (pipeline_blocks order); a module's embeddings go
    with its first block, the heads with the last fusion block."""
    costs = []
    for name in (n for n in STACKS if n in shapes):
        module = shapes[name]
        factor = _training_factor(module, recompute)
        for index in range(module.stack.layers):
            cost = module.stack.block_forward_flops() * factor
            if recompute.select_recompute and not recompute.recompute and module.needs_backward:
                cost += module.stack.block_score_flops()
            if index == 0:
                cost += module.other_forward_flops * factor
            costs.append(cost)
    costs[-1] += shapes["heads"].other_forward_flops * 3
    return costs


def _training_factor(module: ModuleShape, recompute: RecomputeConfig) -> float:
    """Training FLOPs per forward FLOP: forward, the input gradients, and the weight gradients where the
    module's weights train (LoRA adapters' are negligible); recompute adds a forward."""
    if not module.runs:
        return 0.0
    if not module.needs_backward:
        return 1.0  # frozen at the input: forward only
    return (3.0 if module.trainable else 2.0) + (1.0 if recompute.recompute else 0.0)


@functools.lru_cache(maxsize=4096)
def balanced_ranges(costs: Tuple[float, ...], stages: int) -> Tuple[Tuple[int, int], ...]:
    """Contiguous [first, last] block ranges, one per stage, minimising the most expensive stage
    (linear partition by dynamic programming); every stage gets at least one block."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][j]: the smallest max-stage cost of splitting the first j blocks into k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j] or (value == best[k][j] and i > cut[k][j]):
                    best[k][j], cut[k][j] = value, i
    ranges, j = [], n
    for k in range(stages, 0, -1):
        i = cut[k][j]
        ranges.append((i, j - 1))
        j = i
    return tuple(reversed(ranges))


def stage_ranges(strategy: ParallelStrategy, costs: Sequence[float]) -> List[Tuple[int, int]]:
    if strategy.pipeline.assignment == "explicit":
        return [tuple(pair) for pair in strategy.pipeline.layer_ranges]
    return list(balanced_ranges(tuple(costs), strategy.pipeline_stage))


# ----------------------------------------------------------------------------- the plan

@dataclass
class StagePlan:
    stage: int
    blocks: Tuple[int, int]
    first_block: str
    last_block: str
    params: int  # on one rank of the stage
    trainable_params: int
    activation_bytes_per_micro_batch: float
    in_flight: int
    compute_s: float  # per micro-batch
    tp_s: float
    p2p_s: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.tp_s + self.p2p_s


@dataclass
class Plan:
    strategy: Dict
    devices: int
    hardware: Dict
    parameter_count: int
    trainable_parameter_count: int
    # per rank (the most loaded stage), bytes
    parameter_bytes: float
    gradient_bytes: float
    optimizer_bytes: float  # after sharding
    optimizer_bytes_unsharded: float
    activation_bytes_per_micro_batch: float
    activation_bytes_per_micro_batch_no_recompute: float
    in_flight_micro_batches: int
    activation_bytes: float
    total_bytes: float
    # per step and rank, bytes sent
    comm_bytes: Dict[str, float]
    comm_s: Dict[str, float]
    step_time_s: float
    samples_per_s: float
    bubble_fraction: float
    stage_imbalance: float  # slowest / mean stage time
    stages: List[Dict] = field(default_factory=list)
    # a generative recipe's sample (conversation_sizes): its tokens and labelled positions; 0 for the classifier
    sample_tokens: int = 0
    sample_labels: int = 0

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)


def _ring(nbytes: float, n: int, link, phases: int = 2) -> float:
    """Alpha-beta time of a ring collective: phases=2 all-reduce, 1 reduce-scatter or all-gather."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    alpha, bandwidth = link
    return phases * ((n - 1) * alpha + (n - 1) / n * nbytes / bandwidth)


def plan(cfg: Config, strategy: ParallelStrategy, hardware: Hardware = Hardware(), devices: Optional[int] = None,
         validate: bool = True) -> Plan:
    """The plan of training `cfg`'s model with `strategy` (checked with validate_strategy first)."""
    cfg = planning_config(cfg)  # the converted parts' shapes, which the strategy must divide
    if validate:
        validate_strategy(strategy, cfg, devices)
    shapes = model_shapes(cfg)
    s = strategy
    pp, m = s.pipeline_stage, s.micro_batch_num
    compute = DTYPE_BYTES[cfg.train.precision.compute]
    softmax = DTYPE_BYTES[cfg.train.precision.softmax] if cfg.train.precision.compute != "float32" else 4
    blocks = pipeline_blocks(cfg.model)
    costs = block_costs(shapes, s.recompute_config)
    ranges = stage_ranges(s, costs)
    stacks = cfg.model.stacks()
    owner = []  # (module, index within the module) per block
    for name in stacks:
        owner.extend((name, i) for i in range(shapes[name].stack.layers))
    batch = cfg.data.batch_size
    shard = 1
    if s.enable_parallel_optimizer:
        shard = s.data_parallel if s.optimizer_weight_shard_size == -1 else s.optimizer_weight_shard_size
    head_module = "fusion" if cfg.model.generative else "heads"  # a decoder's LM head is split with the decoder
    mp_link = hardware.link(s.model_parallel, 1)
    pp_link = hardware.link(2, s.data_parallel * s.model_parallel)

    stage_plans, worst = [], None
    grad_bytes_by_stage, param_bytes_by_stage = [], []
    p2p_bytes_by_stage, dp_links = [], []
    for k, (first, last) in enumerate(ranges):
        params = trainable = 0.0
        act = act_no_rc = peak_block = 0.0
        flops = tp_bytes = 0.0
        collectives = 0
        dp_group = 1
        for b in range(first, last + 1):
            name, index = owner[b]
            module, stack = shapes[name], shapes[name].stack
            split = s.module(name)
            dp_m, mp_m = split.data_parallel, split.model_parallel
            dp_group = max(dp_group, dp_m)
            samples = batch / (m * dp_m)  # per rank per micro-batch
            sp, rp, lora = stack.block_params(mp_m)
            block = sp / mp_m + rp + lora
            extra = extra_trainable = 0.0
            if index == 0:
                extra += module.other_params + module.table_params / (1 if s.vocab_emb_dp else mp_m)
                extra_trainable += ((extra - module.separate_params if module.trainable else 0.0)
                                    + (module.separate_params if module.separate_trainable else 0.0))
            if index == stack.layers - 1 and name == "fusion":
                heads = shapes["heads"]
                head = heads.params / (s.module(head_module).model_parallel
                                       if heads.vocabulary_split and not s.vocab_emb_dp else 1)
                extra += head
                extra_trainable += head if heads.trainable else 0.0
            params += block + extra
            trainable += (block if module.trainable else lora if module.adapters_trainable else 0) + extra_trainable
            flops += costs[b] * samples / mp_m
            if module.needs_backward:
                scale = samples * hardware.activation_overhead
                a = stack.block_activation_bytes(mp_m, compute, softmax, s.recompute_config) * scale
                full = stack.full_block_activation_bytes(mp_m, compute, softmax) * scale
                act += a
                act_no_rc += full
                peak_block = max(peak_block, full if s.recompute_config.recompute else 0.0)
                if index == stack.layers - 1 and name == "fusion":
                    heads = shapes["heads"]
                    split = s.module(head_module).model_parallel if heads.vocabulary_split and not s.vocab_emb_dp else 1
                    act += heads.output_bytes_per_sample * samples / split
                    act_no_rc += heads.output_bytes_per_sample * samples / split
            if mp_m > 1 and module.runs:
                passes = (2 if module.needs_backward else 0) + (2 if s.recompute_config.recompute else 1)
                tp_bytes += 2 * passes * samples * stack.sequences * stack.tokens * stack.width * compute
                collectives += 2 * passes
        act += peak_block
        # pipeline boundary: the states crossing into the next stage
        boundary = 0.0
        if k < pp - 1:
            name, _ = owner[last]
            done = stacks[:stacks.index(name)] if name != "fusion" else ()
            boundary = sum(shapes[n].output_bytes_per_sample for n in done if n != "fusion")
            boundary += shapes[name].output_bytes_per_sample
            boundary *= batch / (m * s.data_parallel)
        p2p = boundary * (2 if k < pp - 1 else 0)  # forward send, backward receive (and the previous stage's)
        in_flight = min(m, pp - k)
        mp = s.model_parallel
        stage = StagePlan(k, (first, last), blocks[first], blocks[last], int(round(params)), int(round(trainable)),
                          act, in_flight, flops / hardware.flops,
                          (collectives * 2 * (mp - 1) * mp_link[0] + 2 * (mp - 1) / mp * tp_bytes / mp_link[1])
                          if mp > 1 else 0.0,
                          (pp_link[0] * 2 + p2p / pp_link[1]) if p2p else 0.0)
        stage.tp_bytes = tp_bytes * (mp - 1) / mp if mp > 1 else 0.0  # sent per rank (ring)
        stage.act_no_rc = act_no_rc
        stage_plans.append(stage)
        grad_bytes_by_stage.append(trainable * PARAM_BYTES)
        param_bytes_by_stage.append(params * PARAM_BYTES)
        p2p_bytes_by_stage.append(p2p * m)
        dp_links.append(dp_group)

    def memory(st: StagePlan) -> float:
        opt = st.trainable_params * PARAM_BYTES * ADAM_STATES / shard
        return (st.params + st.trainable_params) * PARAM_BYTES + opt + st.activation_bytes_per_micro_batch * st.in_flight

    worst = max(stage_plans, key=memory)
    slowest = max(st.time_s for st in stage_plans)
    mean = sum(st.time_s for st in stage_plans) / len(stage_plans)
    grad = worst.trainable_params * PARAM_BYTES
    dp = s.data_parallel
    dp_link = hardware.link(dp, s.model_parallel)
    dp_time = max(_ring(st.trainable_params * PARAM_BYTES, dp, dp_link) for st in stage_plans)
    comm = {
        "dp_grad_allreduce": grad if dp > 1 else 0.0,  # message size: the rank's gradient bytes
        "dp_sent": 2 * (dp - 1) / dp * grad if dp > 1 else 0.0,
        "tp_reduce_scatter": max(st.tp_bytes for st in stage_plans) * m / 2,
        "tp_all_gather": max(st.tp_bytes for st in stage_plans) * m / 2,
        "pp_send_recv": max(p2p_bytes_by_stage),
    }
    pipeline_s = (m + pp - 1) * slowest
    comm_s = {"dp": dp_time, "tp": (m + pp - 1) * max(st.tp_s for st in stage_plans),
              "pp": (m + pp - 1) * max(st.p2p_s for st in stage_plans)}
    step = pipeline_s + dp_time
    opt_unsharded = worst.trainable_params * PARAM_BYTES * ADAM_STATES
    return Plan(
        strategy=s.to_dict(), devices=s.devices, hardware=dataclasses.asdict(hardware),
        parameter_count=sum(x.params for x in shapes.values()),
        trainable_parameter_count=sum(x.trainable_params for x in shapes.values()),
        parameter_bytes=worst.params * PARAM_BYTES, gradient_bytes=grad,
        optimizer_bytes=opt_unsharded / shard, optimizer_bytes_unsharded=opt_unsharded,
        activation_bytes_per_micro_batch=worst.activation_bytes_per_micro_batch,
        activation_bytes_per_micro_batch_no_recompute=worst.act_no_rc,
        in_flight_micro_batches=worst.in_flight,
        activation_bytes=worst.activation_bytes_per_micro_batch * worst.in_flight,
        total_bytes=memory(worst), comm_bytes=comm, comm_s=comm_s, step_time_s=step,
        samples_per_s=batch / step if step else float("inf"),
        bubble_fraction=bubble_fraction(pp, m), stage_imbalance=slowest / mean if mean else 1.0,
        stages=[{**dataclasses.asdict(st), "time_s": st.time_s, "memory_bytes": memory(st)} for st in stage_plans],
        **dict(zip(("sample_tokens", "sample_labels"), conversation_sizes(cfg) if cfg.model.generative else (0, 0))))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle fraction of a 1F1B (or GPipe) schedule: (pp - 1) / (m + pp - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


# ----------------------------------------------------------------------------- search

def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_strategies(cfg: Config, devices: int, max_model_parallel: int = 8) -> List[ParallelStrategy]:
    """Every (dp, mp, pp, micro_batch_num, parallel optimizer, recompute) for `devices` that validates;
    mp stays inside a node (<= max_model_parallel), micro_batch_num in {1, 2, 4, 8} x pp."""
    found = []
    recomputes = (RecomputeConfig(), RecomputeConfig(select_recompute=True), RecomputeConfig(recompute=True))
    for pp in _divisors(devices):
        for mp in _divisors(devices // pp):
            if mp > max_model_parallel:
                continue
            dp = devices // (pp * mp)
            for factor in (1, 2, 4, 8):
                m = factor * pp
                for sharded, recompute in itertools.product((False, True), recomputes):
                    if sharded and dp == 1:
                        continue
                    strategy = ParallelStrategy(
                        name=f"dp{dp}-mp{mp}-pp{pp}-m{m}{'-zero' if sharded else ''}"
                             f"{'-rc' if recompute.recompute else '-sel' if recompute.select_recompute else ''}",
                        data_parallel=dp, model_parallel=mp, pipeline_stage=pp, micro_batch_num=m,
                        enable_parallel_optimizer=sharded, recompute_config=recompute)
                    try:
                        validate_strategy(strategy, cfg, devices)
                    except ConfigError:
                        continue
                    found.append(strategy)
    return found


def rank(cfg: Config, devices: int, hardware: Hardware = Hardware(),
         pure_data_parallel: bool = False) -> List[Tuple[ParallelStrategy, Plan]]:
    """Every valid strategy for `devices` with its plan, whatever its memory, fastest predicted step first (less
    memory breaks ties)."""
    ranked = [(strategy, plan(cfg, strategy, hardware, devices, validate=False))
              for strategy in candidate_strategies(cfg, devices)
              if not (pure_data_parallel and (strategy.model_parallel > 1 or strategy.pipeline_stage > 1))]
    ranked.sort(key=lambda pair: (pair[1].step_time_s, pair[1].total_bytes))
    return ranked


def memory_cap_bytes(memory_cap_gb: Optional[float], hardware: Hardware) -> float:
    """The per-rank cap: `memory_cap_gb`, else the device's memory."""
    return (memory_cap_gb if memory_cap_gb is not None else hardware.memory_gb) * 1e9


def search(cfg: Config, devices: int, memory_cap_gb: Optional[float] = None, hardware: Hardware = Hardware(),
           pure_data_parallel: bool = False) -> List[Tuple[ParallelStrategy, Plan]]:
    """Valid strategies for `devices` whose per-rank memory fits the cap (default: the device's memory),
    fastest predicted step first (less memory breaks ties)."""
    cap = memory_cap_bytes(memory_cap_gb, hardware)
    return [pair for pair in rank(cfg, devices, hardware, pure_data_parallel) if pair[1].total_bytes <= cap]
