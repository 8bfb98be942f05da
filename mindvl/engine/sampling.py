"""From a step's logits to text, for every runtime that generates: the framework (mindvl.generation), a
model package's graphs (mindvl.engine.decode_loop: `export verify`, the server, the device).

Choosing the next token happens on the host (numpy), per sequence of a batch. The order is transformers' (repetition penalty, temperature, top-k, top-p), so a setting means the same as
in `model.generate` there. Greedy when temperature is 0. A seeded numpy Generator per call makes sampling
reproducible: the same seed, prompts and settings give the same tokens.
"""
from dataclasses import dataclass, field, fields, replace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindvl.engine.grammar import Grammar
from mindvl.errors import ConfigError, shown


MAX_TEMPERATURE = 2.0  # OpenAI's range for temperature: [0, 2]
MAX_STOP_STRINGS = 4  # OpenAI's: "up to 4 sequences"
MAX_STOP_LENGTH = 256  # characters per stop string: matching costs the engine thread per character fed
MAX_PENALTY = 2.0  # OpenAI's range for presence_penalty and frequency_penalty: [-2, 2]
MAX_TOP_LOGPROBS = 20  # OpenAI's: top_logprobs in [0, 20]
SEED_RANGE = (-2 ** 63, 2 ** 63)  # a signed 64-bit integer, as OpenAI's seed; a negative one is taken modulo 2^64


@dataclass
class SamplingConfig:
    """How tokens are chosen and when generation stops. `validate` refuses, by name, every value the sampler
    could not use (a NaN temperature would fail the step of every sequence sharing the batch)."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off; > 1 discourages tokens already in the prompt or the answer
    stop_tokens: List[int] = field(default_factory=list)  # besides the model's own end-of-sequence ids
    stop_strings: List[str] = field(default_factory=list)  # the text is cut before the first one
    seed: Optional[int] = None
    ignore_eos: bool = False  # vLLM's: keep generating past the end-of-sequence tokens (fixed-length benchmarks)
    # OpenAI's, over the tokens generated so far: minus presence for a token said at all, minus frequency x its count
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0  # the most likely tokens (and their log-probabilities) each Delta lists besides its own
    grammar: Optional[Grammar] = None  # what the answer must be (engine.grammar: JSON schema, regex, choice)

    def validate(self) -> None:
        _integer(self.max_new_tokens, "max_new_tokens", low=1)
        _number(self.temperature, "temperature", 0.0, MAX_TEMPERATURE, "in [0, 2] (0: greedy)")
        _integer(self.top_k, "top_k", low=0)
        _number(self.top_p, "top_p", 0.0, 1.0, "in (0, 1]", low_open=True)
        _number(self.repetition_penalty, "repetition_penalty", 0.0, None, "> 0", low_open=True)
        for name in ("presence_penalty", "frequency_penalty"):
            _number(getattr(self, name), name, -MAX_PENALTY, MAX_PENALTY, "in [-2, 2]")
        _integer(self.top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS + 1)
        if self.grammar is not None:
            if not isinstance(self.grammar, Grammar):
                raise ConfigError(f"grammar: expected an engine.grammar.Grammar, got {shown(self.grammar)}")
            self.grammar.validate()
            if self.ignore_eos:
                raise ConfigError("ignore_eos: a grammar ends the answer once it is complete; leave ignore_eos out")
        if self.seed is not None:
            _integer(self.seed, "seed", *SEED_RANGE)
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise ConfigError(f"ignore_eos: expected true or false, got {shown(self.ignore_eos)}")
        for token in self.stop_tokens:
            _integer(token, "stop_tokens", low=0)
        _check_stop_strings(self.stop_strings)


def _integer(value, name: str, low: int, high: Optional[int] = None) -> None:
    """ConfigError unless `value` is an integer (not a bool, not 1.5) in [low, high)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name}: expected an integer, got {shown(value)}")
    if value < low or (high is not None and value >= high):
        span = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ConfigError(f"{name}: expected an integer {span}, got {value}")


def _number(value, name: str, low: float, high: Optional[float], span: str, low_open: bool = False) -> None:
    """ConfigError unless `value` is a real number in [low, high] ((low, high] when low_open; NaN and infinities
    are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name}: expected a number, got {shown(value)}")
    if not np.isfinite(value) or value < low or (low_open and value == low) or (high is not None and value > high):
        raise ConfigError(f"{name}: expected a value {span}, got {value}")


def _check_stop_strings(strings) -> None:
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) for s in strings):
        raise ConfigError(f"stop_strings: expected a list of strings, got {shown(strings)}")
    if len(strings) > MAX_STOP_STRINGS:
        raise ConfigError(f"stop_strings: {len(strings)} given, at most {MAX_STOP_STRINGS} are matched; keep the ones "
                          f"that matter")
    for text in strings:
        if not text:
            raise ConfigError("stop_strings: an empty string would stop at once; remove it")
        if len(text) > MAX_STOP_LENGTH:
            raise ConfigError(f"stop_strings: a string of {len(text)} characters, more than the limit of "
                              f"{MAX_STOP_LENGTH}; shorten it")


def penalise_repetition(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor: a seen token's logit divided by `penalty` when
    positive, multiplied when negative. seen: (batch, vocab) bool."""
    if penalty == 1.0:
        return logits
    scaled = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, scaled, logits)


def penalise_presence(logits: np.ndarray, counts: np.ndarray, settings: SamplingConfig) -> np.ndarray:
    """OpenAI's presence and frequency penalties (vLLM's too): each token's logit lowered by presence_penalty once
    it was generated and by frequency_penalty per time it was. counts: (batch, vocab) the generated tokens'."""
    if not settings.presence_penalty and not settings.frequency_penalty:
        return logits
    return logits - settings.frequency_penalty * counts - settings.presence_penalty * (counts > 0)


def next_tokens(logits: np.ndarray, settings: SamplingConfig, rng: np.random.Generator,
                seen: Optional[np.ndarray] = None, counts: Optional[np.ndarray] = None) -> np.ndarray:
    """logits (batch, vocab) float32 -> token ids (batch,) int32. The penalties come first (repetition over
    `seen`, presence and frequency over `counts`), as in transformers and vLLM."""
    logits = logits.astype(np.float64)
    if seen is not None:
        logits = penalise_repetition(logits, seen, settings.repetition_penalty)
    if counts is not None:
        logits = penalise_presence(logits, counts, settings)
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
    top: Tuple[Tuple[int, float], ...] = ()  # the settings' top_logprobs most likely (token, log-probability)


@dataclass
class Generation:
    """A finished sequence: its text, its tokens (the stop token included when it stopped on one), why it
    ended, how many tokens the prompt had (what the model read), each generated token's log-probability, and how
    many of the conversation's turns were left out."""

    text: str
    tokens: List[int] = field(default_factory=list)
    finish: str = "length"
    prompt_tokens: int = 0
    logprobs: List[float] = field(default_factory=list)
    dropped_turns: int = 0  # the conversation's oldest turns left out so the prompt fits (not read by the model)
    tops: List[Tuple[Tuple[int, float], ...]] = field(default_factory=list)  # each token's Delta.top

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.tokens.append(delta.token)
        self.logprobs.append(delta.logprob)
        self.tops.append(delta.top)
        if delta.finish:
            self.finish = delta.finish

    @property
    def mean_logprob(self) -> float:
        """The mean token log-probability: the answer's confidence (0 for no token)."""
        return float(np.mean(self.logprobs)) if self.logprobs else 0.0


def _log_total(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1)
    return top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))


def token_logprobs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log softmax(logits)[token] per row: logits (batch, vocab), tokens (batch,) -> (batch,) float."""
    logits = logits.astype(np.float64)
    return logits[np.arange(len(tokens)), tokens] - _log_total(logits)


def top_logprobs(logits: np.ndarray, count: int) -> Tuple[Tuple[int, float], ...]:
    """The `count` most likely tokens of one step's logits (vocab,) with their log-probabilities, most likely
    first (ties by token id): the model's own distribution, before penalties, temperature and filtering, as the
    chosen token's logprob is (vLLM's default)."""
    logits = logits.astype(np.float64)
    total = float(_log_total(logits[None])[0])
    best = np.argpartition(-logits, count - 1)[:count] if count < len(logits) else np.arange(len(logits))
    best = best[np.lexsort((best, -logits[best]))]
    return tuple((int(token), float(logits[token] - total)) for token in best)


class StopMatcher:
    """Where stop strings occur in a text fed a piece at a time, in time linear in the text: one
    Knuth-Morris-Pratt automaton per string, so each character fed costs the same however long the answer or
    the strings (a rescan of the text's tail for every string's every prefix cost a 120,000-character stop
    string 0.16 s a token, on the engine thread every stream shares)."""

    def __init__(self, strings: Sequence[str]) -> None:
        self.strings = list(strings)
        self.fallback = [self._failure(s) for s in self.strings]
        self.state = [0] * len(self.strings)  # per string: how many of its first characters the text ends with
        self.fed = 0  # characters fed so far

    @staticmethod
    def _failure(text: str) -> List[int]:
        """KMP's table: for each prefix text[:i + 1], the length of its longest proper prefix that is also its
        suffix."""
        table, k = [0] * len(text), 0
        for i in range(1, len(text)):
            while k and text[i] != text[k]:
                k = table[k - 1]
            if text[i] == text[k]:
                k += 1
            table[i] = k
        return table

    def feed(self, piece: str) -> Optional[int]:
        """Feed the next characters; -> where (in everything fed) the earliest stop string completed by them
        starts, or None."""
        first = None
        for offset, char in enumerate(piece):
            for number, text in enumerate(self.strings):
                k, table = self.state[number], self.fallback[number]
                while k and char != text[k]:
                    k = table[k - 1]
                if char == text[k]:
                    k += 1
                if k == len(text):
                    start = self.fed + offset + 1 - k
                    first = start if first is None else min(first, start)
                    k = table[k - 1]
                self.state[number] = k
        self.fed += len(piece)
        return first

    @property
    def held(self) -> int:
        """How many characters at the end of the text may start a stop string (held back from the stream)."""
        return max(self.state, default=0)


class TextSequence:
    """Host-side state of one sequence while it generates: tokens, the text emitted, stop handling.

    The text is detokenised incrementally, as vLLM does: each step decodes only the tokens since the last
    emitted text (`prefix`..the end) against those of the step before (`prefix`..`read`), so a step's cost does
    not grow with the answer; a piece ending in an incomplete character waits for the next token."""

    def __init__(self, index: int, tokenizer, settings: SamplingConfig, stop_ids: set):
        self.index = index
        self.tokenizer = tokenizer
        self.settings = settings
        self.stop_ids = stop_ids
        self.tokens: List[int] = []
        self.visible: List[int] = []  # the tokens that make text (stop tokens left out)
        self.prefix = self.read = 0  # visible[prefix:read]: the tokens decoded last step, context for the next
        self.text = ""  # the text decoded so far
        self.emitted = 0  # how much of it the deltas gave out
        self.stops = StopMatcher(settings.stop_strings)
        self.finish: Optional[str] = None

    def _decoded(self, flush: bool) -> str:
        """The text the visible tokens add since the last step ('' while it ends in an incomplete character,
        unless `flush`)."""
        def decode(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

        before = decode(self.visible[self.prefix:self.read])
        after = decode(self.visible[self.prefix:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not flush):
            return ""
        self.prefix, self.read = self.read, len(self.visible)
        return after[len(before):]

    def add(self, token: int, last_step: bool, logprob: float = 0.0, top: Tuple[Tuple[int, float], ...] = ()) -> Delta:
        self.tokens.append(int(token))
        stopping = token in self.stop_ids and not self.settings.ignore_eos
        if token not in self.stop_ids:
            self.visible.append(int(token))
        piece = self._decoded(flush=last_step or stopping)
        cut = self.stops.feed(piece)
        self.text += piece
        if stopping or cut is not None:
            self.finish = "stop"
            end = len(self.text) if cut is None else cut
        else:
            self.finish = "length" if last_step else None
            end = len(self.text) - (self.stops.held if self.finish is None else 0)
        delta = Delta(self.index, int(token), self.text[self.emitted:max(end, self.emitted)], self.finish,
                      float(logprob), top)
        self.emitted = max(end, self.emitted)
        return delta
