"""Every setting that takes one of a fixed set of values, defined once: its values and its default.

The recipe's dataclasses (mindvl.config), the cells that act on a value, the generators, the command line's
`choices=` and the device runtime all read these, so a value added here is accepted everywhere at once and a
bad one is refused with the same message wherever it is given:

    train.kernels: expected one of ['auto', 'standard', 'fused'], got 'fast'

A leaf: it imports only mindvl.errors, so cells and the deployment side may use it.
"""
from dataclasses import dataclass
from typing import Any, Tuple

from mindvl.errors import ConfigError


@dataclass(frozen=True)
class Choice:
    """A setting's allowed values (in the order messages and `--help` list them) and its default."""

    values: Tuple[str, ...]
    default: str

    def __post_init__(self) -> None:
        assert self.default in self.values, (self.default, self.values)

    def check(self, key: str, value: Any) -> str:
        """`value` when allowed, else ConfigError naming `key` (the dotted key or argument) and the values."""
        if value not in self.values:
            raise ConfigError(f"{key}: expected one of {list(self.values)}, got {value!r}")
        return value

    def __iter__(self):
        return iter(self.values)

    def __contains__(self, value: Any) -> bool:
        return value in self.values


# How normalisation, activations, attention and the LM head run (train.kernels, LanguageModel and
# MultimodalGenerator's kernels=, mindvl generate --kernels; cells/kernels/__init__.py says what each does).
# "auto": in training each fused kernel where it times faster at the model's shapes; in generation the fused
# kernels, which were faster (and leaner) at every prefill and decode shape timed.
KERNELS = Choice(("auto", "standard", "fused"), "auto")
# How a converted LLM folder stores its products and token table (mindvl convert llm --weights): float32; int8 per
# channel; int4 in groups of 32; gguf: a GGUF's quantized blocks as they are (mindvl/pretrained/gguf_blocks.py)
CONVERTED_WEIGHTS = Choice(("float32", "int8", "int4", "gguf"), "float32")
# The weights a converted LLM generates with (from_pretrained's weights=, mindvl generate --weights): as the folder
# stores them, or a float32 folder quantized as it loads (cells/quantize.py)
GENERATION_WEIGHTS = Choice(("stored", "int8", "int4"), "stored")
IMAGE_MERGES = Choice(("mean", "concat"), "mean")  # model.projector.image_merge

# model.<encoder>.activation (cells/activation.py); a decoder also takes silu (SwiGLU's)
ENCODER_ACTIVATIONS = Choice(("gelu", "gelu_tanh", "relu"), "gelu")
DECODER_ACTIVATIONS = Choice(("gelu", "gelu_tanh", "relu", "silu", "quick_gelu"), "silu")
NORMS = Choice(("rms", "layer"), "rms")  # model.decoder.norm: RMSNorm (weight only) or LayerNorm
LAYER_TYPES = Choice(("global", "local"), "global")  # model.decoder.layer_types[]: full or sliding-window attention
POOLINGS = Choice(("cls", "mean"), "cls")  # model.text.pooling: the [CLS] output (BERT) or the valid tokens' mean
IMAGE_HASHES = Choice(("phash", "dhash"), "phash")  # data.cleaning.hash: near-duplicate hash (DCT or gradient)
UNKNOWN_CHARS = Choice(("unk", "drop"), "unk")  # data.cleaning.unknown_chars: map their words to [UNK], or drop
# data.conversation_kinds[]: where a conversation came from (mindvl.data.conversation_samples)
CONVERSATION_KINDS = Choice(("vqa", "spoken", "caption", "multi", "pair", "user"), "vqa")
DTYPES = Choice(("float32", "float16", "bfloat16"), "float32")  # train.precision.*
LOSS_SCALE_MODES = Choice(("auto", "dynamic", "off"), "auto")  # train.loss_scale.mode
LOSS_WEIGHTINGS = Choice(("fixed", "uncertainty"), "fixed")  # train.loss_weighting
# the device runtime of a LiteModel (mindvl/lite/lite_model.py): "auto" tries the others in this order
LITE_BACKENDS = Choice(("auto", "mindspore_lite", "lite2", "graphcell"), "auto")
EXPORT_TARGETS = Choice(("standard", "lite2"), "standard")  # mindvl export --target: lite2 adds the Lite 2.0 graphs
