"""From a step's logits to text, for every runtime that generates: the framework (mindvl.generation), a
model package's graphs (mindvl.engine.decode_loop: `export verify`, the server, the device).

Choosing the next token happens on the host (numpy), per sequence of a batch. The order is transformers' (repetition penalty, temperature, top-k, top-p), so a setting means the same as
in `model.generate` there. Greedy when temperature is 0. A seeded numpy Generator per call makes sampling
reproducible: the same seed, prompts and settings give the same tokens.
"""
from dataclasses import dataclass, field, fields, replace
from typing import List, Optional

import numpy as np

from mindvl.errors import ConfigError


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
    ignore_eos: bool = False  # vLLM's: keep generating past the end-of-sequence tokens (fixed-length benchmarks)

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


def sampling_config(**overrides) -> SamplingConfig:
    """A SamplingConfig from keyword settings (None: the default), unknown names and bad values refused."""
    names = {f.name for f in fields(SamplingConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"generation settings: unknown {unknown}; valid are {sorted(names)}")
    settings = replace(SamplingConfig(), **{k: v for k, v in overrides.items() if v is not None})
    settings.validate()
    return settings


@dataclass
class Delta:
    """One step of one sequence: the token chosen and the text it adds (empty while a multi-byte character
    or a possible stop string is incomplete). `finish` is set on the sequence's last delta; `logprob` is the
    token's log-probability under the model (before temperature and filtering: the model's confidence)."""

    index: int
    token: int
    text: str
    finish: Optional[str] = None  # "stop" (end-of-sequence token or stop string) or "length"
    logprob: float = 0.0


@dataclass
class Generation:
    """A finished sequence: its text, its tokens (the stop token included when it stopped on one), why it
    ended, how many tokens the prompt had, and each generated token's log-probability."""

    text: str
    tokens: List[int] = field(default_factory=list)
    finish: str = "length"
    prompt_tokens: int = 0
    logprobs: List[float] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.tokens.append(delta.token)
        self.logprobs.append(delta.logprob)
        if delta.finish:
            self.finish = delta.finish

    @property
    def mean_logprob(self) -> float:
        """The mean token log-probability: the answer's confidence (0 for no token)."""
        return float(np.mean(self.logprobs)) if self.logprobs else 0.0


def token_logprobs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log softmax(logits)[token] per row: logits (batch, vocab), tokens (batch,) -> (batch,) float."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1)
    log_total = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
    return logits[np.arange(len(tokens)), tokens] - log_total


class TextSequence:
    """Host-side state of one sequence while it generates: tokens, the text emitted, stop handling."""

    def __init__(self, index: int, tokenizer, settings: SamplingConfig, stop_ids: set):
        self.index = index
        self.tokenizer = tokenizer
        self.settings = settings
        self.stop_ids = stop_ids
        self.tokens: List[int] = []
        self.emitted = ""
        self.finish: Optional[str] = None

    def add(self, token: int, last_step: bool, logprob: float = 0.0) -> Delta:
        self.tokens.append(int(token))
        text = self.tokenizer.decode([t for t in self.tokens if t not in self.stop_ids], skip_special_tokens=True)
        cut = min((text.find(s) for s in self.settings.stop_strings if s in text), default=-1)
        if (token in self.stop_ids and not self.settings.ignore_eos) or cut >= 0:
            self.finish = "stop"
            text = text[:cut] if cut >= 0 else text
        elif last_step:
            self.finish = "length"
        if self.finish is None:  # hold back an incomplete character and what may start a stop string
            text = text.rstrip("\ufffd")
            held = max((k for s in self.settings.stop_strings for k in range(1, len(s))
                        if text.endswith(s[:k])), default=0)
            text = text[:len(text) - held]
        delta = Delta(self.index, int(token), text[len(self.emitted):] if text.startswith(self.emitted) else "",
                      self.finish, float(logprob))
        self.emitted = text if text.startswith(self.emitted) else self.emitted
        return delta
