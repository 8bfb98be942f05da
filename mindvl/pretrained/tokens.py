"""The frozen encoders' token outputs over a data root's training split, so each encoder runs once per input.

With `model.pretrained.cache: DIR`, a run whose encoders are converted, frozen and without LoRA adapters
trains from cached states instead of running DINOv2, MiniLM and Whisper at every step: `fill` runs each
encoder once over every distinct image, question, caption and training clip (inputs equal in bytes are
computed once) and stores its token states through the FeatureCache (keyed by the converted weights'
sha256, the input settings and the input's bytes, so another checkpoint, image size or front end can never
read a stale entry); the loader then reads them per batch (`image`, `text`, `clip`) and the trainer runs
`TokenInputModel`, which shares the model's weights. Evaluation and export keep the full model.

The classifier has three encoders; the generative model (cells.multimodal_lm) two, vision and audio (its
text goes through the decoder, which trains or carries LoRA): `encoder_kinds`. Its inputs are the
conversation tables' images and clips (mindvl.data.reading.conversation_loader.conversation_inputs).

What the cache cannot hold, it refuses (`token_cache`): an encoder that trains (not pretrained, not
frozen, or with LoRA adapters) and augmentation of the encoders' inputs (their outputs would differ
every epoch). The encoders run in inference mode, as frozen encoders should; states are stored in
float16 (|error| < 1e-3 relative to the float32 states) and only for valid tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl import preprocess as P
from mindvl.config import Config, ModelConfig, PreprocessConfig
from mindvl.errors import ConfigError, MindvlError

from .cache import CacheStats, FeatureCache
from .features import pad_batch

KINDS = ("vision", "text", "audio")
GENERATIVE_KINDS = ("vision", "audio")


def encoder_kinds(model_cfg: ModelConfig) -> Tuple[str, ...]:
    """The encoders whose states a recipe's cache holds: the generative model has no text encoder; a native-
    resolution VLM's tower runs at every step (its tokens depend on each image's size), so only its audio
    encoder's, when it hears."""
    if model_cfg.is_native:
        return ("audio",) if model_cfg.native.audio else ()
    return GENERATIVE_KINDS if model_cfg.generative else KINDS


def token_cache(cfg: Config, model) -> Optional["EncoderTokens"]:
    """The recipe's token cache for `model`'s encoders (their weights loaded), None when
    model.pretrained.cache is empty; a ConfigError names every setting that makes the encoders' outputs
    change during training."""
    pretrained = cfg.model.pretrained
    if not pretrained.cache:
        return None
    kinds = encoder_kinds(cfg.model)
    if not kinds:
        raise ConfigError("model.pretrained.cache: a native-resolution VLM that reads images only has no encoder "
                          "whose states are cached (its tower runs at every step); set it to \"\"")
    problems = [f"model.pretrained.{kind} is empty (that encoder trains from scratch)"
                for kind in kinds if not getattr(pretrained, kind)]
    if not pretrained.freeze:
        problems.append("model.pretrained.freeze is false (the encoders train)")
    problems += [f"model.{kind}.lora_rank is {getattr(cfg.model, kind).lora_rank} (its adapters train)"
                 for kind in kinds if getattr(cfg.model, kind).lora_rank]
    if cfg.data.augment.enabled:
        problems.append("data.augment.enabled is true (augmented inputs give other outputs every epoch; "
                        "set it false)")
    if problems:
        raise ConfigError(f"model.pretrained.cache: the encoders' outputs can be cached only when all of them "
                          f"({', '.join(kinds)}) are pretrained, frozen, without LoRA and fed unaugmented inputs, but "
                          f"{'; '.join(problems)}. Fix those, or set model.pretrained.cache: '' to run the "
                          f"encoders at every step")
    return EncoderTokens(Path(pretrained.cache), model, cfg.preprocess, kinds=kinds)


class MissingTokens(MindvlError, RuntimeError):
    """An input whose encoder states are not in the cache although `fill` ran (the folder was cleaned)."""


class EncoderTokens:
    """Cached encoder states under `root`, one FeatureCache namespace per encoder of `model` named in
    `kinds` (keyed by the weights it holds now) and input settings. Holds no reference to the model: it
    travels to the loader's workers."""

    def __init__(self, root: Path, model, pre: PreprocessConfig, batch_size: int = 32,
                 kinds: Sequence[str] = KINDS) -> None:
        self.root = Path(root)
        self.pre = pre
        self.batch_size = batch_size
        self.stats: Dict[str, CacheStats] = {}  # the last `fill`, per encoder
        settings = {
            "vision": {"image_size": pre.image_size, "image_mean": list(pre.image_mean),
                       "image_std": list(pre.image_std)},
            "text": {"input": "int32 token ids"},
            "audio": {key: getattr(pre, key) for key in ("sample_rate", "n_fft", "hop_length", "n_mels",
                                                         "max_audio_frames")}}
        self.caches = {kind: FeatureCache(self.root, getattr(model, kind), {"output": "token states", **settings[kind]},
                                          batch_size=batch_size) for kind in kinds}
        # what a sample without an image or a clip reads (the generative model's text-only conversations)
        shapes = {"vision": lambda: (1 + model.vision.num_patches, model.vision.width),
                  "audio": lambda: (pre.max_audio_frames // 2, model.audio.width)}
        self.blank_shapes = {kind: shape() for kind, shape in shapes.items() if kind in kinds}
        self._texts: Dict[bytes, np.ndarray] = {}  # few distinct texts: kept in memory once read

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_texts"] = {}
        return state

    # -- reading (the loader) ---------------------------------------------------------------------
    def _read(self, kind: str, data: bytes, what: str) -> np.ndarray:
        value = self.caches[kind].get(data)
        if value is None:
            raise MissingTokens(f"model.pretrained.cache: no cached {kind} states for {what} in {self.root} (was the "
                                f"folder cleaned during the run?); restart the run: it refills the cache first")
        return value.astype(np.float32)

    def image(self, data: bytes, what: str = "image") -> np.ndarray:
        """Encoded image -> (1 + N, vision width) float32 states, CLS first."""
        return self._read("vision", data, what)

    def text(self, ids: np.ndarray, mask: np.ndarray, what: str = "text") -> np.ndarray:
        """Padded ids and mask (L,) -> (L, text width) float32 states, zero at padding."""
        key = _text_key(ids, mask)
        if key not in self._texts:
            self._texts[key] = _pad(self._read("text", key, what), len(ids))
        return self._texts[key]

    def clip(self, pcm16: bytes, what: str = "clip") -> np.ndarray:
        """int16 clip -> (max_audio_frames / 2, audio width) float32 states, zero past its tokens."""
        return _pad(self._read("audio", pcm16, what), self.pre.max_audio_frames // 2)

    def blank(self, kind: str) -> np.ndarray:
        """Zero states in the shape `image` ("vision") or `clip` ("audio") returns: a missing attachment."""
        return np.zeros(self.blank_shapes[kind], np.float32)

    # -- filling (the trainer, before the first step) ---------------------------------------------
    def fill(self, model, images: Sequence[bytes], texts: Sequence[np.ndarray], clips: Sequence[bytes],
             log: Optional[Callable[[str], None]] = None, progress: bool = False) -> Dict[str, CacheStats]:
        """Compute and store the states `model`'s encoders give for every input not cached yet.

        images: encoded images; texts: (ids, mask) pairs (none for the generative model); clips: int16
        mono clips at pre.sample_rate.
        `log` receives one line per encoder; `progress` shows a bar over the computations.
        Returns the per-encoder hits, computations and damaged entries (also in `stats`)."""
        from mindspore import Tensor

        pre, batch = self.pre, self.batch_size
        encoders = [getattr(model, kind) for kind in self.caches]
        modes = [cell.training for cell in encoders]
        for cell in encoders:
            cell.set_train(False)

        def vision(chunk: List[bytes]):
            pixels = pad_batch([P.decode_image(data, pre, name="image") for data in chunk], batch)
            return list(model.vision(Tensor(pixels))[0].asnumpy()[:len(chunk)])

        def text(chunk: List[bytes]):
            ids = [np.frombuffer(data, np.int32) for data in chunk]
            padded = pad_batch([_pad(i, pre.max_text_length) for i in ids], batch)
            mask = pad_batch([_pad(np.ones(len(i), np.float32), pre.max_text_length) for i in ids], batch)
            states = model.text(Tensor(padded), Tensor(mask))[0].asnumpy()
            return [states[n, :len(i)] for n, i in enumerate(ids)]

        def audio(chunk: List[bytes]):
            from mindvl.data.records import from_pcm16

            mels, masks = zip(*(P.speech_features(from_pcm16(data), pre, name="clip")
                                for data in chunk))
            states, token_mask, _ = model.audio(Tensor(pad_batch(mels, batch)), Tensor(pad_batch(masks, batch)))
            valid = token_mask.asnumpy().sum(axis=1).astype(int)
            return [states.asnumpy()[n, :valid[n]] for n in range(len(chunk))]

        inputs = {"vision": list(images), "text": [_text_key(ids, mask) for ids, mask in texts],
                  "audio": list(clips)}
        try:
            for kind, compute in (("vision", vision), ("text", text), ("audio", audio)):
                if kind not in self.caches:
                    continue
                cache = self.caches[kind]
                cache.stats = CacheStats()
                cache.fill(inputs[kind], compute, progress=f"token cache {kind}" if progress else "")
                self.stats[kind] = cache.stats
                if log:
                    s = cache.stats
                    log(f"token cache {kind}: {s.computed} computed, {s.hits} cached, {s.damaged} damaged "
                             f"(recomputed) in {cache.folder}")
        finally:
            for cell, mode in zip(encoders, modes):
                cell.set_train(mode)
        return self.stats


def _text_key(ids: np.ndarray, mask: np.ndarray) -> bytes:
    """A text's encoder input: its valid token ids as int32 bytes."""
    return np.asarray(ids)[np.asarray(mask) > 0].astype(np.int32).tobytes()


def _pad(rows: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros((length, *rows.shape[1:]), rows.dtype)
    out[:len(rows)] = rows[:length]
    return out

