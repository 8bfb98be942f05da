"""A model package's generation graphs as the engine's graphs: `attachments` (image and audio -> projected
tokens; a native-resolution VLM's package: `vision_<V>`, a batch's images packed in V patches -> their tokens), a
prefill per prompt-length bucket (`prefill_<L>`) and the decode graphs: `decode`, `decode_wide` (the same step for
WIDE_ROWS rows or more, its products laid out for many rows: cells.linear's docstring, its caches only read and
each row's new key and value returned for the engine to write) and `extend_<steps>`.

The manifest's "generation" section says how they fit (GenerationSpec). The graphs are called through a
`run(name, inputs) -> outputs` function, so the same engine drives GraphCells (the server, `export verify`),
Lite models (the device) or anything else that runs a graph by name, and `to_numpy` turns an output into
an array (caches stay as the runtime returned them between steps: no copy per step).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl.chat import ChatEncoder, chat_template
from mindvl.engine.prompts import GenerationLimits, PromptBatch, PromptLayout, _Layout
from mindvl.errors import ConfigError
from mindvl.package_reader import as_array

SECTION = "generation"  # the manifest's key
ATTACHMENTS = "attachments"
SPEECH = "speech"  # a native package's clips -> their tokens (a model that hears)
DECODE = "decode"
EXTEND_STEPS = 8  # tokens per row of the decoder's several-token step: a reused prefix's rest, or a token + 7 drafts
DECODE_WIDE = "decode_wide"
# rows from which a step runs decode_wide (its caches only read, its new rows returned): vlm-s-native's step (Gemma 3
# 270M, cache 768) at 2 / 4 / 8 / 16 rows took 66.7 / 85.1 / 116.4 / 233.1 ms as decode and 75.2 / 86.9 / 99.1 /
# 132.3 ms as decode_wide
WIDE_ROWS = 8

Run = Callable[[str, Sequence[Any]], Sequence[Any]]


def prefill_name(bucket: int) -> str:
    return f"prefill_{bucket}"


def extend_name(steps: int) -> str:
    return f"extend_{steps}"


def vision_name(patches: int) -> str:
    return f"vision_{patches}"


@dataclass
class GenerationSpec:
    """What a generative package's graphs need to generate: the cache, the buckets, the decoder's shape, the
    chat template and the tokens that stop an answer; `max_new_tokens` bounds a request."""

    cache_len: int
    buckets: List[int]
    layers: int
    vocab_size: int
    width: int
    kv_width: int
    image_tokens: int
    audio_tokens: int
    pad_id: int
    stop_ids: List[int]
    chat_template: str
    max_new_tokens: int
    tokenizer: str = "tokenizer.json"
    defaults: Dict[str, Any] = field(default_factory=dict)  # SamplingConfig fields a request leaves out
    # a native-resolution VLM's package: vision_buckets (patches), merge, window, window_rows, patch_values,
    # tokens_per_second, patches (PatchConfig), video (VideoSampling), default_system (the chat's system turn);
    # where it hears (audio_tokens > 0), speech_shape: a clip's log-mel (n_mels, frames)
    native: Optional[Dict[str, Any]] = None
    extend_steps: int = 0  # the decoder's several-token step (`extend_<steps>`); 0: a package exported before it
    wide_rows: int = 0  # the rows from which a step runs `decode_wide`; 0: a package exported before it


    @classmethod
    def from_manifest(cls, manifest: dict) -> "GenerationSpec":
        section = manifest.get(SECTION)
        if not isinstance(section, dict):
            raise ConfigError(f"package {manifest.get('name')}: no {SECTION!r} section; not a generative package "
                              f"(export a generative run, e.g. vlm-tiny)")
        return cls(**section)

    def to_dict(self) -> dict:
        return asdict(self)

    def graph_names(self, extend: bool = True, wide: bool = True) -> List[str]:
        """Every graph's name; extend False leaves the several-token step out (a server that neither reuses
        prefixes nor speculates), wide False the wide step (a server of fewer than wide_rows streams): each graph
        holds its own copy of the decoder's weights."""
        first = ([vision_name(v) for v in self.native["vision_buckets"]] + ([SPEECH] if self.audio_tokens else [])
                 if self.native else [ATTACHMENTS])
        extended = [extend_name(self.extend_steps)] if extend and self.extend_steps else []
        widened = [DECODE_WIDE] if wide and self.wide_rows else []
        return [*first, *(prefill_name(b) for b in self.buckets), DECODE, *widened, *extended]

    def runs_wide(self, rows: int) -> bool:
        """Whether a step of `rows` rows runs decode_wide (so a caller that never reaches wide_rows rows need not
        load it)."""
        return bool(self.wide_rows) and rows >= self.wide_rows

    @property
    def vision_capacity(self) -> int:
        """The vision tokens a native package's prefill graphs take (its largest vision bucket's)."""
        return self.native["vision_buckets"][-1] // self.native["merge"] ** 2

    @property
    def limits(self) -> GenerationLimits:
        return GenerationLimits(self.cache_len, tuple(self.buckets), self.max_new_tokens)


def package_chat(folder: Path, spec: GenerationSpec) -> ChatEncoder:
    """The package's chat template (with a native package's default system turn) over its tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(folder) / spec.tokenizer))
    template = chat_template(spec.chat_template)
    if spec.native:
        template = replace(template, default_system=spec.native["default_system"])
    return ChatEncoder(tokenizer, template, spec.image_tokens, spec.audio_tokens, spec.pad_id)


def package_layout(folder: Path, manifest: dict) -> _Layout:
    """The prompt layout of a generative package: its chat template, preprocessing (or a native package's vision
    layout) and limits."""
    from mindvl.engine.native_prompts import NativePromptLayout
    from mindvl.engine.vision_layout import package_packing
    from mindvl.preprocess import preprocess_config

    spec = GenerationSpec.from_manifest(manifest)
    chat = package_chat(folder, spec)
    if spec.native:
        native = spec.native
        return NativePromptLayout(chat, spec.limits, package_packing(native), stop_ids=spec.stop_ids,
                                  vision_buckets=native["vision_buckets"], mrope=native.get("mrope", True),
                                  audio_tokens=spec.audio_tokens, speech_shape=native.get("speech_shape", (0, 0)))
    return PromptLayout(chat, preprocess_config(manifest["preprocess"]), spec.limits, spec.pad_id, spec.stop_ids)


class PackageGraphs:
    """A package's graphs run by name (`run`), as the engine calls them: `prefill(batch)` (the attachments
    graph first, only when a prompt has an image or a clip) and `decode(...)`."""

    def __init__(self, spec: GenerationSpec, run: Run, to_numpy: Callable[[Any], np.ndarray] = as_array,
                 extend: bool = True, wide: bool = True):
        """extend: the several-token step is loaded (else extend_steps is 0: the engine takes one token a step);
        wide: the wide step is (else every step runs `decode`)."""
        self.spec = spec
        self.run = run
        self.to_numpy = to_numpy
        self.extend_steps = spec.extend_steps if extend else 0
        self.wide = wide

    def prefill_inputs(self, batch: PromptBatch) -> List[np.ndarray]:
        """A PromptBatch as its prefill graph's inputs."""
        if batch.positions is not None:
            return self._native_prefill_inputs(batch)
        count = len(batch.ids)
        if batch.image.any() or batch.frame_mask.any():
            image_tokens, audio_tokens = (self.to_numpy(o) for o in self.run(ATTACHMENTS, [
                batch.image, batch.mel, batch.frame_mask]))
        else:
            image_tokens = np.zeros((count, self.spec.image_tokens, self.spec.width), np.float32)
            audio_tokens = np.zeros((count, self.spec.audio_tokens, self.spec.width), np.float32)
        return [batch.ids, batch.valid.astype(np.int32), batch.slot_index, image_tokens, audio_tokens]

    def _native_prefill_inputs(self, batch: PromptBatch) -> List[np.ndarray]:
        """The vision graph of the batch's packed size first, only when it has a real patch (segment ids > 0: the
        frames of WindowedPacking's inputs, the segments of ViTPacking's, both third); where the model hears, the
        speech graph, only when a row has a clip."""
        patches, segments = batch.vision[0], batch.vision[2]
        if segments.any():
            tokens = self.to_numpy(self.run(vision_name(patches.shape[1]), list(batch.vision))[0])
        else:
            tokens = np.zeros((self.spec.vision_capacity, self.spec.width), np.float32)
        speech = []
        if self.spec.audio_tokens:
            if batch.frame_mask.any():
                speech = [self.to_numpy(self.run(SPEECH, [batch.mel, batch.frame_mask])[0])]
            else:
                speech = [np.zeros((len(batch.ids), self.spec.audio_tokens, self.spec.width), np.float32)]
        return [batch.ids, batch.valid.astype(np.int32), batch.positions, batch.slot_index, tokens, *speech]

    def prefill(self, batch: PromptBatch) -> Tuple[np.ndarray, List[Any]]:
        """-> (the last logits (rows, vocab), the caches: every layer's keys, then values)."""
        outputs = self.run(prefill_name(batch.ids.shape[1]), self.prefill_inputs(batch))
        return self.to_numpy(outputs[0]), list(outputs[1:])

    def warm_up(self, sizes: Sequence[int]) -> None:
        """Run the decode steps once at each batch size of `sizes`, on zeros: a graph with a dynamic batch compiles
        on the first call of each size (vlm-s-native's decode: 0.6-1.1 s), which would otherwise fall on the
        requests that first make the batch that large (a burst of 16 requests met four sizes and decode_wide)."""
        for rows in sizes:
            for steps in [1] + [self.extend_steps] * bool(self.extend_steps):
                index = np.zeros((rows, steps), np.int32)
                slot = np.tile(np.arange(steps, dtype=np.int32), (rows, 1))
                valid = np.zeros((rows, self.spec.cache_len), bool)
                valid[:, :steps] = True
                cache = np.zeros((rows, self.spec.cache_len, self.spec.kv_width), np.float32)
                self.decode(index, index, slot, valid, [cache] * (2 * self.spec.layers))

    def decode(self, token: np.ndarray, position: np.ndarray, slot: np.ndarray, slot_valid: np.ndarray,
               caches: Sequence[Any]) -> Tuple[np.ndarray, List[Any]]:
        """token, position, slot (rows, steps): one step (`decode`) or the several-token one (`extend_<steps>`)
        -> (logits (rows * steps, vocab), the caches)."""
        name = extend_name(token.shape[1]) if token.shape[1] > 1 else \
            DECODE_WIDE if self.wide and self.spec.runs_wide(len(token)) else DECODE
        outputs = self.run(name, [token, position, slot, slot_valid.astype(np.int32), *caches])
        return self.to_numpy(outputs[0]), list(outputs[1:])
