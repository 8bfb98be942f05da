"""Prompts as the generation graphs' inputs, and the limits a generation must keep: one layout for the
framework's cells (mindvl.generation), a model package's graphs (the server, `export verify`, the device).

A batch of prompts is left-padded to the smallest prompt-length bucket that holds its longest prompt, so
every sequence's last prompt token sits at slot bucket - 1. A text prompt is token ids (TextLayout); a
multimodal one is rendered by the chat template, and each position's row in the batch's modality table
(`chat.modality_slots`) says where the projected image and audio tokens go (PromptLayout).

`GenerationLimits` is the one place a request's size is checked against the graphs (the largest bucket,
the cache's room after the prompt, the package's ceiling on new tokens), with one message each, whoever
asks: the framework, the server or the device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.chat import (AUDIO_SLOT, IMAGE_SLOT, VIDEO_SLOT, ChatEncoder, Rendered, Turn, conversation, modality_slots,
                         placeholder_count, question_turn)
from mindvl.config import PreprocessConfig
from mindvl.errors import ConfigError, InputError, shown

SMALLEST_BUCKET = 16
# Characters of text read per token a prompt may hold: tokenisers average 3-5 characters a token, so a text past
# 32 x the largest bucket cannot fit and is refused before it is tokenised (80 KB of text held a worker 2.6 s).
CHARS_PER_TOKEN = 32


def prompt_buckets(cache_len: int) -> tuple:
    """Prompt lengths a prefill graph is compiled for: 16, 24, 32, 48, 64, 96, ... (powers of two and the
    halfway steps between them, so padding wastes at most a third), each leaving room in the cache."""
    sizes, size = [], SMALLEST_BUCKET
    while size < cache_len:
        sizes += [size, size * 3 // 2]
        size *= 2
    return tuple(s for s in sizes if s < cache_len)


@dataclass(frozen=True)
class GenerationLimits:
    """What one generation may ask of a set of graphs: prompts up to the largest of `buckets`, prompt bucket +
    new tokens within the `cache_len`-slot cache, and at most `max_new_tokens` new tokens (0: no ceiling but
    the cache's; a package records the ceiling it was exported for)."""

    cache_len: int
    buckets: Tuple[int, ...]
    max_new_tokens: int = 0

    @classmethod
    def for_cache(cls, cache_len: int, max_new_tokens: int = 0) -> "GenerationLimits":
        """Every prompt_buckets size of a `cache_len` cache; ConfigError when the cache holds no bucket."""
        if cache_len <= SMALLEST_BUCKET:
            raise ConfigError(f"cache_len: expected more than {SMALLEST_BUCKET} tokens, got {cache_len}")
        return cls(cache_len, prompt_buckets(cache_len), max_new_tokens)

    def with_buckets(self, buckets: Sequence[int]) -> "GenerationLimits":
        return replace(self, buckets=tuple(buckets))

    def check_new_tokens(self, asked: int, field: str = "max_new_tokens") -> None:
        """ConfigError when `asked` new tokens exceed the ceiling; `field`: the name the caller gave it
        (a request's max_tokens, a keyword's max_new_tokens)."""
        if self.max_new_tokens and asked > self.max_new_tokens:
            raise ConfigError(f"{field}: {asked} asked, this model generates at most {self.max_new_tokens} tokens "
                              f"per request")

    def room(self, max_new_tokens: int) -> int:
        """The longest prompt generating `max_new_tokens` can take: the largest bucket leaving room for them in
        the cache (0 when none does: `bucket` then says why)."""
        return max((b for b in self.buckets if b + max_new_tokens <= self.cache_len), default=0)

    def bucket(self, longest: int, max_new_tokens: int) -> int:
        """The smallest bucket holding a `longest`-token prompt, with room for `max_new_tokens` after it."""
        for bucket in self.buckets:
            if bucket >= longest:
                if bucket + max_new_tokens > self.cache_len:
                    raise ConfigError(f"a prompt of {longest} tokens (bucket {bucket}) + max_new_tokens="
                                      f"{max_new_tokens} exceed the cache of {self.cache_len} tokens; lower "
                                      f"max_new_tokens (at most {self.cache_len - bucket} here) or use a larger cache")
                return bucket
        raise ConfigError(f"a prompt of {longest} tokens is longer than the largest bucket ({self.buckets[-1]}) of "
                          f"the {self.cache_len}-token cache; shorten it or use a larger cache")


def preprocessed_prompt(question: str, pre: PreprocessConfig, image: Optional[bytes] = None,
                        audio: Optional[bytes] = None, image_name: str = "image",
                        audio_name: str = "audio") -> "MultimodalPrompt":
    """A question with an encoded image and a spoken clip (either optional) preprocessed as in training
    (mindvl.preprocess: InputError names `image_name` or `audio_name` when one cannot be used)."""
    from mindvl import preprocess as P

    pixels = mel = mask = None
    if image is not None:
        pixels = P.decode_image(image, pre, name=image_name)
    if audio is not None:
        mel, mask = P.speech_features(audio, pre, name=audio_name)
    return MultimodalPrompt(question, pixels, mel, mask)


@dataclass
class MultimodalPrompt:
    """One question: its text (may be empty when spoken), the image (3, H, W) float32 as
    mindvl.preprocess normalises it, the clip's log-mel (n_mels, T) and frame mask (T,) (pad_mel)."""

    question: str = ""
    image: Optional[np.ndarray] = None
    mel: Optional[np.ndarray] = None
    frame_mask: Optional[np.ndarray] = None
    rendered: Optional[Rendered] = None  # its tokens, once a layout fitted it (the server does it off the engine)
    history: Tuple[Turn, ...] = ()  # the conversation's earlier turns (chat.history_turns), a system turn first
    dropped: int = 0  # of which the oldest turns left out to fit (the layout's fit)


@dataclass
class PromptBatch:
    """A batch of prompts laid out for a prefill graph: ids, valid (True on the prompt, False on the left
    padding) (batch, bucket); `encoded`: each prompt's text ids (the repetition penalty's seen tokens). A
    multimodal batch also has slot_index (batch, bucket), image (batch, 3, S, S), mel (batch, n_mels, T) and
    frame_mask (batch, T) (zeros where a prompt has none); a text batch has None there."""

    ids: np.ndarray
    valid: np.ndarray
    encoded: List[np.ndarray]
    slot_index: Optional[np.ndarray] = None
    image: Optional[np.ndarray] = None
    mel: Optional[np.ndarray] = None
    frame_mask: Optional[np.ndarray] = None
    # a native-resolution batch (engine.native_prompts): M-RoPE positions (batch, bucket, 3), each prompt's delta
    # (its generated tokens sit at index + delta), the packed images' vision inputs (vision_layout.graph_inputs)
    positions: Optional[np.ndarray] = None
    deltas: Optional[np.ndarray] = None
    vision: Optional[tuple] = None

    @property
    def multimodal(self) -> bool:
        return self.slot_index is not None

    @property
    def bucket(self) -> int:
        return self.ids.shape[1]


class _Layout:
    """What both layouts share: the tokenizer, the limits, the ids that end an answer and the left padding.
    A layout turns prompts into token ids (`encode`) and a batch of them into a PromptBatch (`batch`)."""

    def __init__(self, tokenizer, limits: GenerationLimits, pad_id: int, stop_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.limits = limits
        self.pad_id = int(pad_id)
        self.stop_ids = frozenset(int(t) for t in stop_ids)

    def encode(self, prompt) -> np.ndarray:
        raise NotImplementedError

    def fit(self, prompt, max_new_tokens: int = 0):
        """The prompt as it is generated with `max_new_tokens` new tokens: a conversation's oldest turns left out
        until it fits the largest bucket that leaves them room (its `dropped` says how many), rendered once.
        A text prompt has no turns: itself."""
        return prompt

    def check_text(self, text: str, name: str = "text") -> None:
        """An error naming `name` for text no prompt can hold (past CHARS_PER_TOKEN x the largest bucket, checked
        before it is tokenised) or that is not valid Unicode (a lone surrogate, which JSON can carry)."""
        from mindvl.preprocess.request import expect

        limit = CHARS_PER_TOKEN * self.limits.buckets[-1]
        if len(expect(text, str, name)) > limit:
            raise ConfigError(f"{name}: {len(text):,} characters; a prompt of this model holds at most "
                              f"{self.limits.buckets[-1]} tokens, so at most {limit:,} characters are read; shorten it")

    def prompt_length(self, prompt) -> int:
        return len(self.encode(prompt))

    def packs(self, prompts: Sequence) -> bool:
        """Whether `prompts`' attachments go through the attachment graphs in one call (each prompt's own
        fixed-size image and clip here: always)."""
        return True

    def admit(self, prompts: Sequence, max_new_tokens: int, field: str = "max_new_tokens") -> Tuple[int, list]:
        """(the bucket `prompts` prefill in together, their encodings), or ConfigError when they cannot be
        generated with `max_new_tokens` new tokens: the one check of every generation's limits."""
        if not prompts:
            raise ConfigError("generate: no prompt given")
        self.limits.check_new_tokens(max_new_tokens, field)
        encoded = [self.encode(p) for p in prompts]
        return self.limits.bucket(max(len(e) for e in encoded), max_new_tokens), encoded

    def _left_padded(self, encoded: Sequence[Sequence[int]], bucket: int) -> Tuple[np.ndarray, np.ndarray]:
        """ids and valid (batch, bucket): each prompt ends at slot bucket - 1."""
        ids = np.full((len(encoded), bucket), self.pad_id, np.int32)
        valid = np.zeros((len(encoded), bucket), bool)
        for row, sequence in enumerate(encoded):
            ids[row, bucket - len(sequence):] = sequence
            valid[row, bucket - len(sequence):] = True
        return ids, valid


class TextLayout(_Layout):
    """Text prompts of a decoder: a string (tokenised, BOS first where the tokenizer adds it) or its token
    ids already (a list or 1-D array of ints, as transformers' `generate(input_ids)` takes them)."""

    def __init__(self, tokenizer, limits: GenerationLimits, vocab_size: int, pad_id: int = 0,
                 stop_ids: Sequence[int] = ()):
        super().__init__(tokenizer, limits, pad_id, stop_ids)
        self.vocab_size = int(vocab_size)

    @staticmethod
    def is_single(prompts) -> bool:
        """One prompt (text, or one sequence of token ids) rather than a list of them."""
        if isinstance(prompts, str):
            return True
        if isinstance(prompts, np.ndarray):
            return prompts.ndim == 1
        return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts)

    def encode(self, prompt: Union[str, Sequence[int]]) -> np.ndarray:
        if isinstance(prompt, str):
            self.check_text(prompt, "prompt")
            ids = np.asarray(self.tokenizer.encode(prompt).ids, np.int64)
        else:
            ids = np.asarray(prompt)
            if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
                raise ConfigError(f"generate: a prompt is text or a sequence of token ids, got {shown(prompt)}")
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise ConfigError(f"generate: token ids must lie in [0, {self.vocab_size}) (the vocabulary), got "
                                  f"{int(ids.min())}..{int(ids.max())}")
        if not ids.size:
            raise ConfigError("generate: an empty prompt (no tokens); give some text")
        return ids.astype(np.int32)

    def batch(self, prompts: Sequence, max_new_tokens: int) -> PromptBatch:
        bucket, encoded = self.admit(prompts, max_new_tokens)
        ids, valid = self._left_padded(encoded, bucket)
        return PromptBatch(ids, valid, list(encoded))


class PromptLayout(_Layout):
    """Renders questions with the chat template and lays a batch of them out for a prefill graph."""

    def __init__(self, chat: ChatEncoder, pre: PreprocessConfig, limits: GenerationLimits, pad_id: int = 0,
                 stop_ids: Optional[Sequence[int]] = None):
        super().__init__(chat.tokenizer, limits, pad_id, [chat.stop_id] if stop_ids is None else stop_ids)
        self.chat = chat
        self.pre = pre
        self.image_tokens, self.audio_tokens = chat.slots[IMAGE_SLOT], chat.slots[AUDIO_SLOT]

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, MultimodalPrompt)

    def with_buckets(self, buckets: Sequence[int]) -> "PromptLayout":
        """This layout over other prompt buckets (one graph's bucket when export writes its samples)."""
        return PromptLayout(self.chat, self.pre, self.limits.with_buckets(buckets), self.pad_id, self.stop_ids)

    def text_only(self, prompt: MultimodalPrompt) -> MultimodalPrompt:
        return MultimodalPrompt(prompt.question)

    def render(self, prompt: MultimodalPrompt, max_length: int = 0) -> Rendered:
        """The prompt's tokens: its history and its question's turn, the image and the clip in the turn that
        places them (the question's unless an earlier turn does); with `max_length` the oldest turns are left
        out to fit it. One image and one clip per conversation, as the graphs take them."""
        self.check_text(prompt.question)
        image, audio = prompt.image is not None, prompt.mel is not None
        if not prompt.question.strip() and not audio:
            raise ConfigError("generate: no question: give the question as text or as audio")
        history = list(prompt.history)
        placed = {kind: placeholder_count(history, kind) for kind in (IMAGE_SLOT, AUDIO_SLOT, VIDEO_SLOT)}
        if placed[IMAGE_SLOT] > image or placed[AUDIO_SLOT] > audio or placed[VIDEO_SLOT]:
            raise InputError(f"history: the conversation places {placed[IMAGE_SLOT]} image(s), {placed[AUDIO_SLOT]} "
                             f"clip(s) and {placed[VIDEO_SLOT]} video(s) for {int(image)} image(s) and {int(audio)} "
                             f"clip(s) sent; this model takes one image and one clip per conversation and no video")
        turn = question_turn(prompt.question, image=image and not placed[IMAGE_SLOT],
                             audio=audio and not placed[AUDIO_SLOT])
        return self.chat.prompt(conversation(history + [turn]), images=int(image), audios=int(audio),
                                max_length=max_length, drop_oldest=max_length > 0)

    def fit(self, prompt: MultimodalPrompt, max_new_tokens: int = 0) -> MultimodalPrompt:
        if prompt.rendered is not None:
            return prompt
        rendered = self.render(prompt, self.limits.room(max_new_tokens))
        return replace(prompt, rendered=rendered, dropped=rendered.dropped)

    def encode(self, prompt: MultimodalPrompt) -> Rendered:
        return self.render(prompt) if prompt.rendered is None else prompt.rendered

    def batch(self, prompts: Sequence[MultimodalPrompt], max_new_tokens: int) -> PromptBatch:
        bucket, rendered = self.admit(prompts, max_new_tokens)
        batch = len(prompts)
        ids, valid = self._left_padded([r.ids for r in rendered], bucket)
        slot_index = np.full((batch, bucket), batch * (self.image_tokens + self.audio_tokens), np.int32)
        size, frames = self.pre.image_size, self.pre.max_audio_frames
        image = np.zeros((batch, 3, size, size), np.float32)
        mel = np.zeros((batch, self.pre.n_mels, frames), np.float32)
        frame_mask = np.zeros((batch, frames), np.float32)
        for row, (prompt, r) in enumerate(zip(prompts, rendered)):
            slot_index[row, bucket - len(r):] = modality_slots(r, row, batch, self.image_tokens, self.audio_tokens)
            if prompt.image is not None:
                image[row] = prompt.image
            if prompt.mel is not None:
                mel[row], frame_mask[row] = prompt.mel, prompt.frame_mask
        return PromptBatch(ids, valid, [r.ids[r.kinds == 0] for r in rendered], slot_index, image, mel, frame_mask)
