"""Choosing the next token from a step's logits, on the host (numpy), per sequence of a batch.

The order is transformers' (repetition penalty, temperature, top-k, top-p), so a setting means the same as
in `model.generate` there. Greedy when temperature is 0. A seeded numpy Generator per call makes sampling
reproducible: the same seed, prompts and settings give the same tokens.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from mindvl.config import ConfigError


@dataclass
class SamplingConfig:
    """How tokens are chosen and when generation stops."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off; > 1 discourages tokens already in the prompt or the answer
    stop_tokens: List[int] = field(default_factory=list)  # besides the model's own end-of-sequence ids
    stop_strings: List[str] = field(default_factory=list)  # the text is cut before the first one
    seed: Optional[int] = None

    def validate(self) -> None:
        if self.max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens: expected a value > 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature: expected 0 (greedy) or a value > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k: expected 0 (off) or a value > 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: expected a value in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"repetition_penalty: expected a value > 0, got {self.repetition_penalty}")
        if any(not s for s in self.stop_strings):
            raise ConfigError("stop_strings: an empty string would stop at once; remove it")


def penalise_repetition(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor: a seen token's logit divided by `penalty` when
    positive, multiplied when negative. seen: (batch, vocab) bool."""
    if penalty == 1.0:
        return logits
    scaled = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, scaled, logits)


def next_tokens(logits: np.ndarray, settings: SamplingConfig, rng: np.random.Generator,
                seen: Optional[np.ndarray] = None) -> np.ndarray:
    """logits (batch, vocab) float32 -> token ids (batch,) int32."""
    logits = logits.astype(np.float64)
    if seen is not None:
        logits = penalise_repetition(logits, seen, settings.repetition_penalty)
    if settings.temperature == 0:
        return logits.argmax(axis=-1).astype(np.int32)
    logits = logits / settings.temperature
    if settings.top_k:
        k = min(settings.top_k, logits.shape[-1])
        kth = np.partition(logits, -k, axis=-1)[:, -k][:, None]  # the k-th largest, without a full sort
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if settings.top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= settings.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs], np.int32)
