"""A generative model's prompts as its graphs' inputs: the same layout for the framework's cells
(mindvl.generation), a model package's prefill graphs (the server, `export verify`) and the device.

A batch of prompts is left-padded to the smallest prompt-length bucket that holds its longest prompt, so
every sequence's last prompt token sits at slot bucket - 1. Each position's row in the batch's modality
table (`chat.modality_slots`) says where the projected image and audio tokens go.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, ChatEncoder, Rendered, modality_slots, question_turn
from mindvl.config import ConfigError, PreprocessConfig

SMALLEST_BUCKET = 16


def prompt_buckets(cache_len: int) -> tuple:
    """Prompt lengths a prefill graph is compiled for: 16, 24, 32, 48, 64, 96, ... (powers of two and the
    halfway steps between them, so padding wastes at most a third), each leaving room in the cache."""
    sizes, size = [], SMALLEST_BUCKET
    while size < cache_len:
        sizes += [size, size * 3 // 2]
        size *= 2
    return tuple(s for s in sizes if s < cache_len)


def choose_bucket(buckets: Sequence[int], cache_len: int, longest: int, max_new_tokens: int) -> int:
    """The smallest bucket holding a `longest`-token prompt, with room for `max_new_tokens` after it."""
    for bucket in buckets:
        if bucket >= longest:
            if bucket + max_new_tokens > cache_len:
                raise ConfigError(f"a prompt of {longest} tokens (bucket {bucket}) + max_new_tokens="
                                  f"{max_new_tokens} exceed the cache of {cache_len} tokens; lower "
                                  f"max_new_tokens (at most {cache_len - bucket} here) or use a larger cache")
            return bucket
    raise ConfigError(f"a prompt of {longest} tokens is longer than the largest bucket ({buckets[-1]}) of the "
                      f"{cache_len}-token cache; shorten it or use a larger cache")


@dataclass
class MultimodalPrompt:
    """One question: its text (may be empty when spoken), the image (3, H, W) float32 as
    mindvl.preprocess normalises it, the clip's log-mel (n_mels, T) and frame mask (T,) (pad_mel)."""

    question: str = ""
    image: Optional[np.ndarray] = None
    mel: Optional[np.ndarray] = None
    frame_mask: Optional[np.ndarray] = None


@dataclass
class PromptBatch:
    """A batch of prompts laid out for a prefill graph: ids, valid (True on the prompt, False on the left
    padding), slot_index (batch, bucket); image (batch, 3, S, S), mel (batch, n_mels, T), frame_mask (batch, T)
    (zeros where a prompt has none); `encoded`: each prompt's text ids (the repetition penalty's seen tokens)."""

    ids: np.ndarray
    valid: np.ndarray
    slot_index: np.ndarray
    image: np.ndarray
    mel: np.ndarray
    frame_mask: np.ndarray
    encoded: List[np.ndarray]

    @property
    def bucket(self) -> int:
        return self.ids.shape[1]


class PromptLayout:
    """Renders questions with the chat template and lays a batch of them out for a prefill graph."""

    def __init__(self, chat: ChatEncoder, pre: PreprocessConfig, buckets: Sequence[int], cache_len: int,
                 pad_id: int = 0):
        self.chat = chat
        self.pre = pre
        self.buckets = tuple(buckets)
        self.cache_len = int(cache_len)
        self.pad_id = int(pad_id)
        self.image_tokens, self.audio_tokens = chat.slots[IMAGE_SLOT], chat.slots[AUDIO_SLOT]

    def render(self, prompt: MultimodalPrompt) -> Rendered:
        image, audio = prompt.image is not None, prompt.mel is not None
        if not prompt.question.strip() and not audio:
            raise ConfigError("generate: no question: give the question as text or as audio")
        turn = question_turn(prompt.question, image=image, audio=audio)
        return self.chat.prompt([turn], images=int(image), audios=int(audio))

    def bucket_of(self, prompts: Sequence[MultimodalPrompt], max_new_tokens: int) -> Tuple[int, List[Rendered]]:
        rendered = [self.render(p) for p in prompts]
        return choose_bucket(self.buckets, self.cache_len, max(len(r) for r in rendered), max_new_tokens), rendered

    def batch(self, prompts: Sequence[MultimodalPrompt], max_new_tokens: int) -> PromptBatch:
        if not prompts:
            raise ConfigError("generate: no prompt given")
        bucket, rendered = self.bucket_of(prompts, max_new_tokens)
        batch = len(prompts)
        ids = np.full((batch, bucket), self.pad_id, np.int32)
        valid = np.zeros((batch, bucket), bool)
        slot_index = np.full((batch, bucket), batch * (self.image_tokens + self.audio_tokens), np.int32)
        size, frames = self.pre.image_size, self.pre.max_audio_frames
        image = np.zeros((batch, 3, size, size), np.float32)
        mel = np.zeros((batch, self.pre.n_mels, frames), np.float32)
        frame_mask = np.zeros((batch, frames), np.float32)
        for row, (prompt, r) in enumerate(zip(prompts, rendered)):
            start = bucket - len(r)
            ids[row, start:] = r.ids
            valid[row, start:] = True
            slot_index[row, start:] = modality_slots(r, row, batch, self.image_tokens, self.audio_tokens)
            if prompt.image is not None:
                image[row] = prompt.image
            if prompt.mel is not None:
                mel[row], frame_mask[row] = prompt.mel, prompt.frame_mask
        return PromptBatch(ids, valid, slot_index, image, mel, frame_mask, [r.ids[r.kinds == 0] for r in rendered])
