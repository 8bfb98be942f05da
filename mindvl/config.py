"""Typed run configuration loaded from YAML recipes.

A recipe is a YAML mapping whose sections mirror the dataclasses below. Loading is strict: an unknown
key or a value of the wrong type raises `ConfigError` naming the dotted path, what was given and what
is allowed, because a silently ignored typo in a long training run costs hours.

Recipes ship in `mindvl/configs/`; `load_config("tiny")` finds them by name, any other string is a
path. A recipe may say `include: other` (a name or a path relative to the including file) and then
override keys; `overrides` (the CLI's `--set a.b=value`) apply last.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from mindvl.choices import (CONVERSATION_KINDS, DECODER_ACTIVATIONS, DTYPES, ENCODER_ACTIVATIONS, IMAGE_HASHES, IMAGE_MERGES,
                            KERNELS, LAYER_TYPES, LOSS_SCALE_MODES, LOSS_WEIGHTINGS, NORMS, POOLINGS, UNKNOWN_CHARS)
from mindvl.errors import ConfigError

RECIPE_DIR = Path(__file__).parent / "configs"




@dataclass
class PreprocessConfig:
    """Input conventions shared by the loader, the model and the deployed graphs (no train/serve skew)."""

    image_size: int = 64
    image_mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    sample_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    n_mels: int = 80
    max_audio_frames: int = 300  # log-mel frames; clips are padded or rejected beyond this
    max_text_length: int = 16  # tokens including [CLS] and [SEP]
    max_answer_length: int = 4  # LM target tokens including [BOS] and [EOS]

    def validate(self) -> None:
        _positive(self, "preprocess", ["image_size", "sample_rate", "n_fft", "hop_length", "n_mels",
                                       "max_audio_frames", "max_text_length", "max_answer_length"])
        for name in ("image_mean", "image_std"):
            if len(getattr(self, name)) != 3:
                raise ConfigError(f"preprocess.{name}: expected 3 values (R, G, B), got {getattr(self, name)}")
        if any(s <= 0 for s in self.image_std):
            raise ConfigError(f"preprocess.image_std: expected values > 0, got {self.image_std}")
        if self.max_audio_frames % 2:
            raise ConfigError(f"preprocess.max_audio_frames: expected an even number (the audio encoder "
                              f"halves time), got {self.max_audio_frames}")


@dataclass
class EncoderConfig:
    """One Transformer stack; every encoder and the fusion model share this shape of settings."""

    width: int = 128
    layers: int = 2
    heads: int = 4
    # 0: width // heads; > 0: the attention's inner width is heads * head_dim, which may differ from
    # width (a model with pruned heads keeps its head size, mindvl.train.prune)
    head_dim: int = 0
    mlp_ratio: float = 4.0  # FFN hidden width = round(width * mlp_ratio)
    pre_norm: bool = True
    activation: str = ENCODER_ACTIVATIONS.default
    layer_scale: float = 0.0  # 0 disables LayerScale
    norm_eps: float = 1e-6
    lora_rank: int = 0  # > 0: LoRA adapters of this rank on every attention's query and value projections
    lora_alpha: float = 16.0  # LoRA update scale alpha / rank

    def validate(self, path: str) -> None:
        _positive(self, path, ["width", "layers", "heads", "mlp_ratio"])
        if self.lora_rank < 0:
            raise ConfigError(f"{path}.lora_rank: expected 0 (off) or a positive rank, got {self.lora_rank}")
        if self.head_dim < 0:
            raise ConfigError(f"{path}.head_dim: expected 0 (width // heads) or a positive size, got {self.head_dim}")
        if not self.head_dim and self.width % self.heads:
            raise ConfigError(f"{path}.width: {self.width} is not divisible by {path}.heads={self.heads}; "
                              f"make it divisible or set {path}.head_dim")
        ENCODER_ACTIVATIONS.check(f"{path}.activation", self.activation)


@dataclass
class DecoderConfig(EncoderConfig):
    """A causal language model: the same block family as the encoders, with the options decoder-only LLMs
    use. Gemma 3, Llama and Qwen2 are settings of this (mindvl.pretrained.llm writes them explicitly into a
    converted folder's config.json); nothing about a family is hard-coded in the cells."""

    layers: int = 0  # 0: no decoder (a recipe's partial model.decoder keeps it absent until layers are set)
    activation: str = DECODER_ACTIVATIONS.default
    vocab_size: int = 0
    kv_heads: int = 0  # 0: heads (multi-head attention); fewer: grouped-query attention (heads % kv_heads == 0)
    norm: str = NORMS.default  # rms (weight only, applied as stored) or layer
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys before the rotation (Gemma 3)
    gated_mlp: bool = True  # down(act(gate(x)) * up(x)) instead of fc2(act(fc1(x)))
    sandwich_norm: bool = False  # norms also after attention and after the MLP, before the residual add
    attention_bias: bool = False  # biases on q/k/v (Qwen2)
    output_bias: bool = False  # bias on the attention's output projection
    mlp_bias: bool = False
    attention_scale: float = 0.0  # 0: head_dim ** -0.5 (Gemma 3: query_pre_attn_scalar ** -0.5)
    rope_theta: float = 10000.0  # rotary base of the global layers
    local_rope_theta: float = 0.0  # rotary base of the sliding-window layers; 0: rope_theta
    sliding_window: int = 0  # tokens a "local" layer's query sees, itself included
    layer_types: List[str] = field(default_factory=list)  # per layer, "global" or "local"; empty: all global
    embed_scale: float = 1.0  # token embeddings are multiplied by it (Gemma: sqrt(width))
    tie_embeddings: bool = True  # the LM head is the embedding matrix
    max_positions: int = 8192  # the longest sequence (prompt + generated) the model was trained for
    # M-RoPE (Qwen2-VL, Qwen2.5-VL): the half head's rotary frequencies in sections turned by the time, height and
    # width positions of a token (an image token's grid place; a text token's three are equal: 1-D RoPE); empty: 1-D
    mrope_section: List[int] = field(default_factory=list)

    def validate(self, path: str) -> None:
        _positive(self, path, ["width", "layers", "heads", "mlp_ratio", "max_positions"])
        if self.mrope_section and sum(self.mrope_section) * 2 != (self.head_dim or self.width // self.heads):
            raise ConfigError(f"{path}.mrope_section: {self.mrope_section} sums to {sum(self.mrope_section)}, not half "
                              f"the head_dim ({(self.head_dim or self.width // self.heads) // 2})")
        if self.vocab_size < 0:
            raise ConfigError(f"{path}.vocab_size: expected 0 (the tokenizer's size) or more, got {self.vocab_size}")
        if not self.head_dim and self.width % self.heads:
            raise ConfigError(f"{path}.width: {self.width} is not divisible by {path}.heads={self.heads}; "
                              f"make it divisible or set {path}.head_dim")
        kv_heads = self.kv_heads or self.heads
        if kv_heads < 0 or self.heads % kv_heads:
            raise ConfigError(f"{path}.kv_heads: {self.kv_heads} does not divide heads={self.heads}")
        DECODER_ACTIVATIONS.check(f"{path}.activation", self.activation)
        NORMS.check(f"{path}.norm", self.norm)
        if self.layer_types and len(self.layer_types) != self.layers:
            raise ConfigError(f"{path}.layer_types: {len(self.layer_types)} entries for {self.layers} layers")
        for index, kind in enumerate(self.layer_types):
            LAYER_TYPES.check(f"{path}.layer_types[{index}]", kind)
        if "local" in self.layer_types and self.sliding_window <= 0:
            raise ConfigError(f"{path}.sliding_window: local layers need a window > 0, got {self.sliding_window}")

    def layer_is_local(self, index: int) -> bool:
        return bool(self.layer_types) and self.layer_types[index] == "local"


@dataclass
class VisionConfig(EncoderConfig):
    patch_size: int = 8


@dataclass
class TextConfig(EncoderConfig):
    vocab_size: int = 0  # 0: taken from the data set's tokenizer
    max_positions: int = 64
    pooling: str = POOLINGS.default  # cls: the [CLS] output (BERT); mean: mean of the valid tokens (sentence-transformers)

    def validate(self, path: str) -> None:
        super().validate(path)
        POOLINGS.check(f"{path}.pooling", self.pooling)


@dataclass
class AudioConfig(EncoderConfig):
    pass


@dataclass
class PretrainedConfig:
    """Converted pretrained encoders the model starts from (model.pretrained; `mindvl convert`).

    A folder's config.json decides its encoder's shape (model.<kind> keeps only lora_rank and
    lora_alpha), and the recipe's preprocess must feed the encoder what it was trained on; both are
    checked when training starts (mindvl.pretrained.bind). A pretrained text encoder needs the data
    built with its tokenizer (data.tokenizer: the same folder).
    """

    vision: str = ""  # folder written by `mindvl convert dinov2`; "": the encoder trains from scratch
    text: str = ""  # folder written by `mindvl convert minilm`
    audio: str = ""  # folder written by `mindvl convert whisper-base`
    # folder written by `mindvl convert llm`: the generative model's decoder (its config.json sets
    # model.decoder but its lora settings); frozen like the encoders, LoRA adapters still train
    decoder: str = ""
    # folder written by `mindvl convert vlm` (Qwen2-VL, Qwen2.5-VL): the whole native-resolution model, its
    # config.json setting model.native and model.decoder (but their lora settings); frozen like the others
    vlm: str = ""
    freeze: bool = True  # keep their weights fixed; LoRA adapters (model.<kind>.lora_rank > 0) still train
    # Folder of the frozen encoders' cached outputs (mindvl.pretrained.tokens): training runs each encoder
    # once per distinct input instead of at every step. "": run them at every step.
    cache: str = ""


@dataclass
class ProjectorConfig:
    """How the encoders' states enter the decoder of a generative model (model.projector): each encoder's
    tokens are pooled to at most a budget, then an MLP (Linear, GELU, Linear: LLaVA's mlp2x_gelu)
    maps them to the decoder's width. Fewer tokens make every step cheaper and let longer conversations
    fit; LLaVA-style pooling keeps 64 of DINOv2's 256 patches at 224 px. image_merge: how a k x k block of
    patches becomes one token, "mean" (averaged) or "concat" (their states side by side, the MLP reading k^2 x
    the vision width: Qwen2-VL's merger, which keeps where in the block each patch was)."""

    image_tokens: int = 64  # at most; patches pooled in k x k blocks, the smallest k dividing the grid that fits
    audio_tokens: int = 32  # at most per clip; the encoder's tokens pooled in runs of k (valid tokens only)
    hidden: int = 0  # the MLP's hidden width; 0: the decoder's width
    image_merge: str = "mean"

    def validate(self) -> None:
        _positive(self, "model.projector", ["image_tokens", "audio_tokens"])
        IMAGE_MERGES.check("model.projector.image_merge", self.image_merge)
        if self.hidden < 0:
            raise ConfigError(f"model.projector.hidden: expected 0 (the decoder's width) or more, got {self.hidden}")


@dataclass
class NativeConfig:
    """A native-resolution VLM's vision side (model.native; set from model.pretrained.vlm's folder when bound, so
    a run's config.json rebuilds it): the tower (cells.native_vision.NativeVisionTower's settings, `window` its
    windows' side in merged blocks), how images are cut (mindvl.preprocess.native_resolution.PatchConfig's
    fields), the M-RoPE time scale of a video, and the chat's default system turn. layers 0: no native tower.
    vision_bucket: a training batch's packed patches are padded to a multiple of it (one graph per size met).

    family "dinov2": a ViT with a CLS token as the tower instead (cells.native_vision.ViTTower): the encoder is
    model.vision (from model.pretrained.vision), its position table `table` x `table` patches (bound from the
    converted folder), each merge x merge block of patch states concatenated and projected (model.projector's
    hidden width) into a decoder of its own (model.pretrained.decoder); images cut at their own resolution with
    temporal_patch_size 1 and the encoder's normalisation; with `audio` it hears too (model.audio's encoder, from
    model.pretrained.audio, and a projector: cells.native_vlm), its states cacheable (model.pretrained.cache)."""

    layers: int = 0
    width: int = 0
    heads: int = 0
    mlp_width: int = 0
    out_width: int = 0
    patch_values: int = 1176
    merge: int = 2
    full_layers: List[int] = field(default_factory=list)
    family: str = "qwen2_5_vl"
    window: int = 0
    tokens_per_second: float = 0.0
    patch_size: int = 14
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: List[float] = field(default_factory=lambda: [0.48145466, 0.4578275, 0.40821073])
    image_std: List[float] = field(default_factory=lambda: [0.26862954, 0.26130258, 0.27577711])
    default_system: Optional[str] = None
    tokenizer: str = ""  # its tokenizer.json (bound from model.pretrained.vlm; a merged run's own copy)
    converted: str = ""  # the converted folder it came from (bound; kept by a merge): `mindvl export hf` writes
    #                      a trained run back in that checkpoint's layout, with its files
    vision_bucket: int = 256
    table: int = 0  # family "dinov2": the side of the encoder's position table, in patches (bound)
    audio: bool = False

    @property
    def vit(self) -> bool:
        """The tower is a ViT with a CLS token (family "dinov2") rather than the Qwen family's."""
        return self.family == "dinov2"

    def validate(self) -> None:
        if self.layers < 0:
            raise ConfigError(f"model.native.layers: expected 0 (no native tower) or more, got {self.layers}")
        if self.audio and not self.vit:
            raise ConfigError("model.native.audio: only a dinov2 tower's recipe hears (its decoder is converted "
                              "apart from the tower); a converted Qwen VLM reads images and video")
        if self.vit:
            _positive(self, "model.native", ["patch_values", "merge", "patch_size", "min_pixels", "max_pixels",
                                              "vision_bucket"])
            if self.layers or self.temporal_patch_size != 1:
                raise ConfigError("model.native: a dinov2 tower is model.vision (layers 0 here) and cuts images "
                                  "with temporal_patch_size 1")
        elif self.layers:
            _positive(self, "model.native", ["width", "heads", "mlp_width", "out_width", "patch_values", "merge",
                                              "patch_size", "temporal_patch_size", "min_pixels", "max_pixels",
                                              "vision_bucket"])
            if self.family not in ("qwen2_5_vl", "qwen2_vl"):
                raise ConfigError(f"model.native.family: expected qwen2_5_vl, qwen2_vl or dinov2, got "
                                  f"{self.family!r}")

    def tower(self) -> Dict[str, Any]:
        """NativeVisionTower's keyword settings."""
        return {"width": self.width, "layers": self.layers, "heads": self.heads, "mlp_width": self.mlp_width,
                "out_width": self.out_width, "patch_values": self.patch_values, "merge": self.merge,
                "full_layers": tuple(self.full_layers), "family": self.family,
                "window_row": self.window * self.window * self.merge * self.merge}

    def encoder(self) -> "EncoderConfig":
        """The tower as an EncoderConfig (its shape: what strategies split and pipelines cut)."""
        return EncoderConfig(width=self.width, layers=self.layers, heads=self.heads,
                             mlp_ratio=self.mlp_width / self.width if self.width else 4.0)

    def patches(self) -> Dict[str, Any]:
        """PatchConfig's keyword settings."""
        return {"patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                "image_mean": tuple(self.image_mean), "image_std": tuple(self.image_std)}


@dataclass
class ModelConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    fusion: EncoderConfig = field(default_factory=EncoderConfig)
    # layers 0: no decoder, the fusion Transformer answers with a class and a word. layers > 0: a causal
    # language model takes the fusion Transformer's place (strategies' and modules' "fusion" address it)
    # and the question's text enters it as tokens, so no text encoder runs. Planned by `mindvl plan`;
    # building and training it come with the generative recipe.
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    native: NativeConfig = field(default_factory=NativeConfig)  # a native-resolution VLM's tower (layers > 0)
    # how conversations are laid out for the decoder (mindvl.chat.TEMPLATES); "auto": the converted decoder's
    # family's, or "word" for a decoder trained from scratch on the data set's word tokenizer (checked when
    # the recipe is bound: mindvl.chat.recipe_template)
    chat_template: str = "auto"
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    embed_dim: int = 64  # contrastive embedding width
    num_answers: int = 13  # easy-VQA's; 0: the data set's answer count (meta.json), e.g. for --from-folder data
    logit_scale_init: float = 2.6593  # log(1 / 0.07), as CLIP
    dropout: float = 0.0

    def validate(self) -> None:
        self.vision.validate("model.vision")
        self.text.validate("model.text")
        self.audio.validate("model.audio")
        self.fusion.validate("model.fusion")
        if self.decoder.layers < 0:
            raise ConfigError(f"model.decoder.layers: expected 0 (no decoder) or more, got {self.decoder.layers}")
        if self.decoder.layers > 0:
            self.decoder.validate("model.decoder")
        self.native.validate()
        if self.generative:
            self.projector.validate()
            if self.pretrained.text:
                raise ConfigError("model.pretrained.text: a generative model reads the text with its decoder; "
                                  "remove the text encoder's folder")
        _positive(self, "model", ["embed_dim"])
        if self.num_answers < 0:
            raise ConfigError(f"model.num_answers: expected >= 0 (0 follows the data), got {self.num_answers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: expected 0 <= dropout < 1, got {self.dropout}")

    @property
    def generative(self) -> bool:
        """A decoder answers in words: model.decoder given, or a converted LLM or VLM to take it from."""
        return self.decoder.layers > 0 or bool(self.pretrained.decoder) or self.is_native

    @property
    def is_native(self) -> bool:
        """A native-resolution VLM (model.native's tower, or a converted VLM to take it from)."""
        return self.native.layers > 0 or bool(self.pretrained.vlm) or self.native.vit

    def stacks(self) -> Tuple[str, ...]:
        """The Transformer stacks the model runs, in pipeline order (STACKS without the text encoder when
        a decoder reads the text)."""
        return tuple(name for name in STACKS if not (self.generative and name == "text")
                     and not (self.is_native and name == "audio"))

    def stack(self, name: str) -> EncoderConfig:
        """The settings of stack `name`: model.<name>, model.decoder in the fusion Transformer's place, a native
        VLM's tower in the vision encoder's."""
        if name == "vision" and self.native.layers > 0:
            return self.native.encoder()
        return self.decoder if name == "fusion" and self.generative else getattr(self, name)


@dataclass
class CleaningConfig:
    """Thresholds of `mindvl data build`'s cleaning passes (data.cleaning); see mindvl/data/build/cleaning.py.

    The defaults are calibrated on the full easy-VQA set (flat shapes on pale backgrounds), where they drop
    only true near-copies; photo data sets want a higher `min_sharpness` (~100). Every check is off at 0
    (or -1 where 0 is a meaningful value), except decode errors and non-finite audio, which are always dropped.
    """

    # images
    exact_duplicates: bool = True  # merge images whose decoded RGB pixels are identical (sha256)
    hash: str = IMAGE_HASHES.default  # 64-bit perceptual hash for near-duplicates: "phash" (DCT) or "dhash" (gradient)
    max_hash_distance: int = 4  # near-duplicate candidates: Hamming distance <= this; -1 turns near-dups off
    max_pixel_difference: float = 32.0  # ...confirmed when no 16x16 RGB thumbnail pixel differs by more (0..255)
    cross_split_duplicates: bool = True  # drop train images that (near-)duplicate a test image
    min_sharpness: float = 10.0  # variance of the Laplacian, max over R, G, B (0..255 scale); 0 off
    min_entropy: float = 0.05  # bits of the image's colour histogram (a blank image has 0); 0 off
    # audio (user clips and synthesised ones)
    min_audio_seconds: float = 0.3
    silence_dbfs: float = -50.0  # a clip whose RMS level is below this is silent
    max_clipped_fraction: float = 0.01  # fraction of samples at full scale (|x| >= 0.999)
    # text (questions, answers, captions)
    min_words: int = 2  # questions with fewer words are dropped (captions need 1, answers 1)
    # the characters a text may hold after NFKC and lower-casing (whitespace is always fine)
    alphabet: str = ("abcdefghijklmnopqrstuvwxyz0123456789" "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœß"
                     ".,;:!?'\"()[]-/&%+#@$*=<>_")
    unknown_chars: str = UNKNOWN_CHARS.default  # characters outside `alphabet`: "unk" maps their words to [UNK], "drop" drops
    max_unknown_fraction: float = 0.1  # ...and with "unk", a text with a larger fraction of them is dropped
    # image <-> caption alignment, scored by a trained mindvl run
    align_checkpoint: str = ""  # run folder, checkpoint folder or model.safetensors; "" turns it off
    align_min_similarity: float = 0.0  # pairs whose cosine similarity is below this are dropped

    def validate(self) -> None:
        path = "data.cleaning"
        IMAGE_HASHES.check(f"{path}.hash", self.hash)
        if not -1 <= self.max_hash_distance <= 64:
            raise ConfigError(f"{path}.max_hash_distance: expected a Hamming distance in [0, 64] or -1 (off), "
                              f"got {self.max_hash_distance}")
        if not 0.0 <= self.max_pixel_difference <= 255.0:
            raise ConfigError(f"{path}.max_pixel_difference: expected a value in [0, 255], got "
                              f"{self.max_pixel_difference}")
        for name, high in (("min_sharpness", None), ("min_entropy", 24.0), ("min_audio_seconds", None)):
            value = getattr(self, name)
            if value < 0 or (high is not None and value > high):
                raise ConfigError(f"{path}.{name}: expected a value >= 0{f' and <= {high}' if high else ''} "
                                  f"(0 turns the check off), got {value}")
        if self.silence_dbfs > 0:
            raise ConfigError(f"{path}.silence_dbfs: expected a level <= 0 dBFS (for example -50), "
                              f"got {self.silence_dbfs}")
        for name in ("max_clipped_fraction", "max_unknown_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{path}.{name}: expected a fraction in [0, 1], got {getattr(self, name)}")
        if self.min_words < 0:
            raise ConfigError(f"{path}.min_words: expected >= 0, got {self.min_words}")
        if not self.alphabet.strip():
            raise ConfigError(f"{path}.alphabet: expected the characters a text may hold, got an empty string")
        if self.alphabet != self.alphabet.lower():
            raise ConfigError(f"{path}.alphabet: texts are lower-cased before the check, so upper-case "
                              f"characters never match; give them in lower case")
        UNKNOWN_CHARS.check(f"{path}.unknown_chars", self.unknown_chars)
        if not -1.0 <= self.align_min_similarity <= 1.0:
            raise ConfigError(f"{path}.align_min_similarity: expected a cosine similarity in [-1, 1], "
                              f"got {self.align_min_similarity}")


@dataclass
class AugmentConfig:
    """Train-only augmentation (data.augment); every strength 0 (or range [1, 1]) turns that one off.

    Colour jitter keeps hue and saturation off by default: easy-VQA asks about colours.
    """

    enabled: bool = True
    crop_scale: List[float] = field(default_factory=lambda: [0.85, 1.0])  # random-resized-crop area range
    crop_ratio: List[float] = field(default_factory=lambda: [0.9, 1.1])  # its aspect-ratio range
    flip: float = 0.5  # probability of a horizontal flip
    brightness: float = 0.1  # jitter factors drawn from [1 - s, 1 + s]
    contrast: float = 0.1
    saturation: float = 0.0
    hue: float = 0.0  # max hue shift as a fraction of the colour wheel
    token_mask: float = 0.0  # probability that a question word becomes [UNK]
    # Speed perturbation factor range, e.g. [0.9, 1.1]; off by default: it re-computes every mel
    # (measured: the tiny loader falls from 620 to 360 samples/s), and the voices already vary.
    speed: List[float] = field(default_factory=lambda: [1.0, 1.0])
    pitch: float = 0.0  # max pitch shift in semitones (librosa; costs ~ms per clip)
    noise: float = 0.0  # probability of added white noise
    noise_snr_db: List[float] = field(default_factory=lambda: [20.0, 40.0])  # its signal-to-noise range

    def validate(self) -> None:
        for name in ("crop_scale", "crop_ratio", "speed", "noise_snr_db"):
            low_high = getattr(self, name)
            if len(low_high) != 2 or low_high[0] > low_high[1] or low_high[0] <= 0 and name != "noise_snr_db":
                raise ConfigError(f"data.augment.{name}: expected [low, high] with 0 < low <= high, got {low_high}")
        if self.crop_scale[1] > 1.0:
            raise ConfigError(f"data.augment.crop_scale: the area fraction cannot exceed 1, got {self.crop_scale}")
        for name in ("flip", "token_mask", "noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"data.augment.{name}: expected a probability in [0, 1], got {getattr(self, name)}")
        for name in ("brightness", "contrast", "saturation"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"data.augment.{name}: expected 0 <= strength < 1, got {getattr(self, name)}")
        if not 0.0 <= self.hue <= 0.5:
            raise ConfigError(f"data.augment.hue: expected 0 <= hue <= 0.5, got {self.hue}")
        if self.pitch < 0:
            raise ConfigError(f"data.augment.pitch: expected >= 0 semitones, got {self.pitch}")


@dataclass
class PackingConfig:
    """Online packing of a batch's Transformer inputs into rows with segment ids (data.packing).

    Three streams are packed (mindvl/data/reading/packing.py): the fusion sequences into `length`-token rows,
    the questions' and captions' tokens into `text_length`-token rows, the clips' mel frames into
    `audio_frames`-frame rows. A stream's number of rows is the smallest entry of its bucket list
    (`rows`, `text_rows`, `audio_rows`; empty: derived from batch_size) that holds the batch, else its
    padded layout, so graph mode compiles once per bucket combination met, never per batch. Disabled:
    one sample per row, padded to the longest possible sample (the classic layout).
    """

    enabled: bool = True
    length: int = 128  # fusion tokens per packed row; at least the longest possible sample
    rows: List[int] = field(default_factory=list)  # fusion row-count buckets; empty: derived from batch_size
    text_length: int = 32  # text tokens per packed row; at least preprocess.max_text_length
    text_rows: List[int] = field(default_factory=list)  # text row-count buckets; empty: derived
    audio_frames: int = 256  # mel frames per packed audio row; even, at least preprocess.max_audio_frames
    audio_rows: List[int] = field(default_factory=list)  # audio row-count buckets; empty: derived
    log_every: int = 50  # steps between packing statistics in the log and TensorBoard

    def validate(self) -> None:
        _positive(self, "data.packing", ["length", "text_length", "audio_frames", "log_every"])
        if self.audio_frames % 2:
            raise ConfigError(f"data.packing.audio_frames: expected an even number (clips start at even "
                              f"frames: the audio encoder halves time), got {self.audio_frames}")
        for name in ("rows", "text_rows", "audio_rows"):
            rows = getattr(self, name)
            if any(r <= 0 for r in rows) or sorted(set(rows)) != list(rows):
                raise ConfigError(f"data.packing.{name}: expected increasing positive row counts, got {rows}")


@dataclass
class DataConfig:
    root: str = "mindvl_data"  # where `mindvl data build` writes and training reads
    source: str = "easy-vqa"  # "easy-vqa", or a folder in the layout of mindvl/data/build/userdata.py
    # "": a word tokenizer built over the data's texts; else a published tokenizer.json (or a converted
    # text encoder's folder) that every text is tokenised with, e.g. for a pretrained text encoder
    tokenizer: str = ""
    limit: int = 0  # at most this many source images per split (0: all)
    shards: int = 1  # MindRecord files per split (contiguous sample_id ranges)
    train_voices: List[str] = field(default_factory=lambda: ["en-us", "en-gb", "en-us+f3", "en-gb-scotland+m3"])
    test_voices: List[str] = field(default_factory=lambda: ["en-us+f4", "en-gb-x-rp+m7"])
    speech_rates: List[int] = field(default_factory=lambda: [150, 175])  # words per minute
    batch_size: int = 64  # global batch per optimizer step: split among msrun workers and train.grad_accumulation
    num_workers: int = 2
    # Which question modality the fused model sees, as probabilities of [text, audio, both].
    question_modality_mix: List[float] = field(default_factory=lambda: [0.4, 0.4, 0.2])
    # share of the train split's images held out (with all their questions) as the validation split
    # that training evaluates on (train.eval_every); 0: none
    validation_fraction: float = 0.0
    # the generative model trains on these kinds of conversation (mindvl.data.conversation_samples): vqa,
    # spoken, caption, multi, user (a folder's own lines); empty: all. Stage 1 aligns on [caption].
    conversation_kinds: List[str] = field(default_factory=list)
    seed: int = 0
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)

    def validate(self) -> None:
        _positive(self, "data", ["batch_size", "num_workers", "shards"])
        if not self.source.strip():
            raise ConfigError("data.source: expected \"easy-vqa\" or the path of a data folder, got an empty string")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ConfigError(f"data.validation_fraction: expected 0 <= fraction < 1, got {self.validation_fraction}")
        if self.limit < 0:
            raise ConfigError(f"data.limit: expected >= 0 (0 means all), got {self.limit}")
        for kind in self.conversation_kinds:
            CONVERSATION_KINDS.check("data.conversation_kinds[]", kind)
        if not self.train_voices or not self.test_voices:
            raise ConfigError("data.train_voices / data.test_voices: expected at least one voice each")
        if set(self.train_voices) & set(self.test_voices):
            raise ConfigError(f"data.test_voices: must be voices training never hears; shared with "
                              f"data.train_voices: {sorted(set(self.train_voices) & set(self.test_voices))}")
        if not self.speech_rates or any(r < 80 or r > 450 for r in self.speech_rates):
            raise ConfigError(f"data.speech_rates: expected words per minute in [80, 450], got {self.speech_rates}")
        mix = self.question_modality_mix
        if len(mix) != 3 or any(p < 0 for p in mix) or abs(sum(mix) - 1.0) > 1e-6:
            raise ConfigError(f"data.question_modality_mix: expected 3 probabilities [text, audio, both] "
                              f"summing to 1, got {mix}")
        self.cleaning.validate()
        self.augment.validate()
        self.packing.validate()


@dataclass
class LossWeights:
    contrastive: float = 0.5
    answer: float = 1.0
    lm: float = 0.5


@dataclass
class PrecisionConfig:
    """train.precision: the compute dtype per cell kind, applied once by mindvl.train.precision.

    `compute` covers everything not named here (projections, attention matmuls, activations,
    embeddings). A low-precision policy runs the network in `compute` and keeps the kinds set to
    float32 as float32 islands (mindspore.amp's black list); parameters stay float32 (master weights).
    float16 on the CPU is correct but slower than float32; bfloat16 compute needs an Ascend chip.
    """

    compute: str = DTYPES.default
    norm: str = DTYPES.default  # LayerNorm
    softmax: str = DTYPES.default  # attention probabilities
    loss: str = DTYPES.default  # the objectives, computed on the network's outputs

    def validate(self) -> None:
        for name in ("compute", "norm", "softmax", "loss"):
            DTYPES.check(f"train.precision.{name}", getattr(self, name))
        low = {getattr(self, n) for n in ("compute", "norm", "softmax", "loss")} - {"float32"}
        if len(low) > 1:
            raise ConfigError(f"train.precision: one low-precision dtype per policy, got {sorted(low)}")
        for name in ("norm", "softmax"):
            if self.compute == "float32" and getattr(self, name) != "float32":
                raise ConfigError(f"train.precision.{name}: {getattr(self, name)} inside a float32 network is not "
                                  f"supported; set train.precision.compute to {getattr(self, name)} and keep "
                                  f"{name} float32")

    @property
    def low_dtype(self) -> str:
        """The policy's low-precision dtype, or float32 when there is none."""
        return next((getattr(self, n) for n in ("compute", "loss") if getattr(self, n) != "float32"), "float32")


@dataclass
class LossScaleConfig:
    """train.loss_scale: dynamic loss scaling (mindspore.amp.DynamicLossScaler).

    mode "auto" scales when the precision policy uses float16 (bfloat16 and float32 need none),
    "dynamic" always, "off" never. An overflowing step is skipped and the scale divided by `factor`;
    after `window` finite steps it is multiplied by `factor`.
    """

    mode: str = LOSS_SCALE_MODES.default
    init: float = 65536.0
    factor: int = 2
    window: int = 1000

    def validate(self) -> None:
        LOSS_SCALE_MODES.check("train.loss_scale.mode", self.mode)
        _positive(self, "train.loss_scale", ["init", "window"])
        if self.factor <= 1:
            raise ConfigError(f"train.loss_scale.factor: expected > 1, got {self.factor}")


STACKS = ("vision", "text", "audio", "fusion")  # the Transformer stacks: model.<name> configs, cells <name>.encoder
MODULES = (*STACKS, "heads")  # what freezing, precision and parallel strategies address by name


@dataclass
class ModuleConfig:
    """train.modules.<module>: its optimizer group and recomputation."""

    lr_scale: float = 1.0  # multiplies train.lr (and the schedule) for this module's parameters
    weight_decay: Optional[float] = None  # None: train.weight_decay
    frozen: bool = False  # no gradients, no optimizer state
    recompute: List[int] = field(default_factory=list)  # Transformer block indices recomputed in backward

    def validate(self, path: str) -> None:
        if self.lr_scale < 0:
            raise ConfigError(f"{path}.lr_scale: expected >= 0, got {self.lr_scale}")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ConfigError(f"{path}.weight_decay: expected >= 0, got {self.weight_decay}")
        if any(i < 0 for i in self.recompute) or len(set(self.recompute)) != len(self.recompute):
            raise ConfigError(f"{path}.recompute: expected distinct block indices >= 0, got {self.recompute}")


@dataclass
class ModulesConfig:
    """The model's modules as the optimizer sees them: encoders by name, `fusion` (the fusion
    Transformer), `heads` (projections, logit scales, answer and LM heads)."""

    vision: ModuleConfig = field(default_factory=ModuleConfig)
    text: ModuleConfig = field(default_factory=ModuleConfig)
    audio: ModuleConfig = field(default_factory=ModuleConfig)
    fusion: ModuleConfig = field(default_factory=ModuleConfig)
    heads: ModuleConfig = field(default_factory=ModuleConfig)

    def validate(self) -> None:
        for name in MODULES:
            getattr(self, name).validate(f"train.modules.{name}")
        if self.heads.recompute:
            raise ConfigError("train.modules.heads.recompute: the heads have no Transformer blocks")


@dataclass
class DistillConfig:
    """train.distill: knowledge distillation from a trained teacher run into the recipe's model (the student).

    The frozen teacher runs on the student's packed batches, so it must come from the same data build and
    preprocess (checked when training starts; mindvl/train/distill.py). The objective is task_weight x the
    recipe's objectives + answer_weight and lm_weight x KL(teacher || student) of the answer and LM logits
    softened by `temperature` (times T^2, Hinton et al. 2015) + feature_weight x the MSE between a learned
    linear map of student fusion states and the teacher's (FitNets), over the valid packed slots.
    """

    teacher: str = ""  # run folder, step_* folder or model.safetensors of `mindvl train`; "": no distillation
    temperature: float = 2.0
    task_weight: float = 1.0  # the recipe's own objectives (train.loss_weights), as a whole
    answer_weight: float = 1.0
    lm_weight: float = 0.5
    feature_weight: float = 1.0
    # [[teacher fusion block, student fusion block], ...]: their output states are matched; empty: none
    feature_layers: List[List[int]] = field(default_factory=list)

    def validate(self) -> None:
        path = "train.distill"
        if self.temperature <= 0:
            raise ConfigError(f"{path}.temperature: expected a value > 0, got {self.temperature}")
        weights = ("task_weight", "answer_weight", "lm_weight", "feature_weight")
        for name in weights:
            if getattr(self, name) < 0:
                raise ConfigError(f"{path}.{name}: expected >= 0, got {getattr(self, name)}")
        for index, pair in enumerate(self.feature_layers):
            if len(pair) != 2 or any(layer < 0 for layer in pair):
                raise ConfigError(f"{path}.feature_layers[{index}]: expected [teacher block, student block] "
                                  f"with indices >= 0, got {pair}")
        if len({tuple(pair) for pair in self.feature_layers}) != len(self.feature_layers):
            raise ConfigError(f"{path}.feature_layers: expected distinct pairs, got {self.feature_layers}")
        if self.teacher and not (self.answer_weight > 0 or self.lm_weight > 0
                                 or self.feature_weight > 0 and self.feature_layers):
            raise ConfigError(f"{path}: the teacher would teach nothing; set answer_weight, lm_weight or "
                              f"feature_weight (with feature_layers) > 0, or teacher to \"\" to train alone")


@dataclass
class TrainConfig:
    output_dir: str = "runs/tiny"
    epochs: int = 1
    max_steps: int = 0  # 0: run `epochs` full passes
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0  # global-norm clip; 0 disables
    loss_weights: LossWeights = field(default_factory=LossWeights)
    # "fixed": loss_weights; "uncertainty": learned weights exp(-s_i) L_i + s_i (Kendall et al., 2018),
    # s_i starting at -log(loss_weights.<name>); an objective weighted 0 stays off
    loss_weighting: str = LOSS_WEIGHTINGS.default
    grad_accumulation: int = 1  # micro-batches per optimizer step (data.batch_size is split among them)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    modules: ModulesConfig = field(default_factory=ModulesConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    # a run or checkpoint whose weights start this one (every tensor of it the model has, same name and
    # shape; the rest keeps its initialisation): stage 2 of the generative recipe starts from stage 1's
    # projectors. Ignored when resuming (the checkpoint holds everything).
    init_from: str = ""
    checkpoint_every: int = 500  # steps; a checkpoint is also written at the end
    keep_checkpoints: int = 3  # the newest K step_* checkpoints are kept (and the best one); 0 keeps all
    eval_every: int = 0  # steps between validation evaluations (0: none); the best checkpoint is tracked
    log_every: int = 10
    seed: int = 0
    # a parallel strategy: a file of parallel_configs/ by name (dp2) or a YAML path; "": data parallel over
    # however many ranks msrun started (mindvl.parallel)
    parallel: str = ""
    # "auto": each fused kernel where it times faster than the standard operator on this machine at the
    # model's shapes (timed once, cached; `mindvl kernels` shows the decisions); "fused": fused kernels per
    # backend (cells/kernels): on the CPU mindvl's C++ kernels (LayerNorm, a Linear's product and bias, GELU,
    # bias + GELU, attention core, scaled masked softmax), on Ascend flash attention; "standard": MindSpore's
    # operators everywhere. Exported graphs always hold the standard ones.
    kernels: str = KERNELS.default

    def validate(self) -> None:
        _positive(self, "train", ["epochs", "lr", "checkpoint_every", "log_every", "grad_accumulation"])
        LOSS_WEIGHTINGS.check("train.loss_weighting", self.loss_weighting)
        KERNELS.check("train.kernels", self.kernels)
        for name in ("keep_checkpoints", "eval_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: expected >= 0, got {getattr(self, name)}")
        self.precision.validate()
        self.loss_scale.validate()
        self.modules.validate()
        self.distill.validate()
        for name in ("max_steps", "warmup_steps", "weight_decay", "grad_clip", "min_lr"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: expected >= 0, got {getattr(self, name)}")
        for name in ("contrastive", "answer", "lm"):
            if getattr(self.loss_weights, name) < 0:
                raise ConfigError(f"train.loss_weights.{name}: expected >= 0, got "
                                  f"{getattr(self.loss_weights, name)}")


@dataclass
class Config:
    name: str = "custom"
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> "Config":
        self.preprocess.validate()
        self.model.validate()
        self.data.validate()
        self.train.validate()
        if self.preprocess.image_size % self.model.vision.patch_size:
            raise ConfigError(f"model.vision.patch_size: {self.model.vision.patch_size} does not divide "
                              f"preprocess.image_size={self.preprocess.image_size}")
        if self.preprocess.max_text_length > self.model.text.max_positions:
            raise ConfigError(f"preprocess.max_text_length: {self.preprocess.max_text_length} exceeds "
                              f"model.text.max_positions={self.model.text.max_positions}")
        return self

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(obj: Any, path: str, names: Sequence[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{path}.{name}: expected a value > 0, got {value!r}")



# ----------------------------------------------------------------------------- building from mappings

def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, List):
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None)) + " or null"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return build_dataclass(tp, value, path)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(path, value, args[0])
    if origin in (list, List):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected {_describe(tp)}, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 3e-4 (no dot) as a string: accept plain numerals
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{path}: expected {_describe(tp)}, got {value!r}")


def build_dataclass(cls: type, values: Mapping[str, Any], path: str = "") -> Any:
    """Build `cls` from a mapping, rejecting unknown keys with the list of valid ones."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(f"{dotted}: unknown key; valid keys here are {sorted(fields)}")
        kwargs[key] = _coerce(dotted, value, hints[key])
    return cls(**kwargs)


# ----------------------------------------------------------------------------- recipes and overrides

def recipe_names() -> List[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def recipes_writing(output_dir: str) -> List[str]:
    """The shipped recipes whose runs land in `output_dir` (train.output_dir): what to train when a later
    stage's train.init_from names a run that does not exist yet."""
    def written(name: str) -> Path:
        train = _load_mapping(RECIPE_DIR / f"{name}.yaml").get("train", {})
        return Path(train.get("output_dir", TrainConfig.output_dir)).resolve()

    return [name for name in recipe_names() if written(name) == Path(output_dir).resolve()]


def _resolve(name_or_path: str, relative_to: Optional[Path] = None) -> Path:
    candidates = [Path(name_or_path)]
    if relative_to is not None:
        candidates.insert(0, relative_to / name_or_path)
    if not name_or_path.endswith((".yaml", ".yml")):
        candidates.append(RECIPE_DIR / f"{name_or_path}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config {name_or_path!r}: no such recipe or file; recipes shipped with mindvl: "
                      f"{recipe_names()}")


def read_yaml(path: Path) -> Dict[str, Any]:
    """The mapping at the top of a YAML file; ConfigError names the file when it is not one."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _merge(base: Dict[str, Any], top: Mapping[str, Any]) -> Dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_mapping(path: Path, seen: Sequence[Path] = ()) -> Dict[str, Any]:
    if path.resolve() in seen:
        raise ConfigError(f"config {path}: include cycle through {[str(p) for p in seen]}")
    data = read_yaml(path)
    include = data.pop("include", None)
    if include is None:
        return data
    if not isinstance(include, str):
        raise ConfigError(f"{path}: include: expected a recipe name or path, got {include!r}")
    base = _load_mapping(_resolve(include, path.parent), [*seen, path.resolve()])
    return _merge(base, data)


def parse_override(text: str) -> Dict[str, Any]:
    """Turn 'train.lr=3e-4' into {'train': {'lr': 0.0003}}; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, for example train.lr=3e-4")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected a dotted key such as train.lr")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: value is not valid YAML ({exc})") from exc
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def load_config(name_or_path: str = "tiny", overrides: Sequence[str] = ()) -> Config:
    """Load a recipe by name or path, apply `KEY=VALUE` overrides, validate and return it."""
    data = _load_mapping(_resolve(name_or_path))
    for override in overrides:
        data = _merge(data, parse_override(override))
    return build_dataclass(Config, data).validate()


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuild a config saved with `Config.to_dict` (checkpoints and model packages store it)."""
    return build_dataclass(Config, data).validate()
