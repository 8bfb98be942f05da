"""Prompt prefixes kept with their key/value cache rows, so a prompt that starts like an earlier one (a system
prompt, an earlier turn of the conversation, the same image) is prefilled from its first new token.

A prompt is keyed by its token ids (a modality slot holds the pad id), which of them are modality slots, and a
digest of its attachments (the image, the clip, a native prompt's patches): two prompts share the slots' rows only
when they share the attachments, and text before the first slot whatever follows. The rows are the prompt's
own (compact: its first token at row 0), every layer's keys then values, so reusing them is a copy into a fresh
cache row; the engine (decode_loop.DecodeBatch) extends the rest of the prompt through the decoder's several-token
step. Entries are evicted least recently used beyond `capacity_bytes`; an entry whose tokens another entry
continues is dropped for it.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

# The fewest tokens worth reusing: below this a prompt is prefilled whole (a few tokens save less than the
# several-token steps cost to set up)
MIN_REUSED = 8


@dataclass(frozen=True)
class PromptKey:
    """What a prompt's cache rows depend on: tokens (length,) int32, slots (length,) bool (modality slots), the
    attachments' digest and each token's 1-D position (length,) (its index; plus a native prompt's M-RoPE delta
    after its images)."""

    tokens: np.ndarray
    slots: np.ndarray
    digest: bytes
    positions: np.ndarray

    @classmethod
    def of(cls, batch, row: int = 0) -> "PromptKey":
        """Row `row` of a PromptBatch (engine.prompts)."""
        valid = batch.valid[row].astype(bool)
        tokens = batch.ids[row][valid].astype(np.int32)
        if batch.slot_index is None:
            slots = np.zeros(len(tokens), bool)
        else:  # text takes the modality table's zero row, its last: every prompt has text (its template's)
            slots = batch.slot_index[row][valid] < batch.slot_index[row].max()
        digest = hashlib.sha256()
        for name in ("image", "mel", "frame_mask"):
            value = getattr(batch, name)
            if value is not None:
                digest.update(np.ascontiguousarray(value[row]).tobytes())
        for value in batch.vision or ():
            digest.update(np.ascontiguousarray(value).tobytes())
        if batch.positions is None:
            positions = np.arange(len(tokens), dtype=np.int32)
        else:
            place = batch.positions[row][valid]
            positions = (place[:, 0] if place.ndim == 2 else place).astype(np.int32)
        return cls(tokens, slots, digest.digest(), positions)

    def shared(self, other: "PromptKey") -> int:
        """How many leading tokens of this prompt have the same cache rows as `other`'s."""
        length = min(len(self.tokens), len(other.tokens))
        differ = np.flatnonzero((self.tokens[:length] != other.tokens[:length]) |
                                (self.slots[:length] != other.slots[:length]))
        same = int(differ[0]) if differ.size else length
        if self.digest != other.digest:
            first_slot = np.flatnonzero(self.slots[:same])
            same = int(first_slot[0]) if first_slot.size else same
        return same


@dataclass
class CachedPrefix:
    key: PromptKey
    rows: List[np.ndarray]  # every layer's keys, then values: (length, kv_width) each

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rows)


class PrefixCache:
    """Cached prompt prefixes up to `capacity_bytes` (see the module docstring); `hits`, `misses` and
    `reused_tokens` count lookups."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.entries: "OrderedDict[int, CachedPrefix]" = OrderedDict()  # least recently used first
        self.size = 0
        self._next = 0
        self.hits = self.misses = self.reused_tokens = 0

    def lookup(self, key: PromptKey) -> Optional[Tuple[CachedPrefix, int]]:
        """The entry sharing most of `key`'s leading tokens and how many it gives (at most all but the last
        token, whose logits the prompt needs; and only the leading tokens before the first new slot: the
        several-token step takes text), or None below MIN_REUSED."""
        best, reused = None, 0
        for handle, entry in self.entries.items():
            same = min(key.shared(entry.key), len(key.tokens) - 1)
            if same > reused:
                best, reused = handle, same
        if best is None or reused < MIN_REUSED or key.slots[reused:].any():
            self.misses += 1
            return None
        self.entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += reused
        return self.entries[best], reused

    def add(self, key: PromptKey, rows: Sequence[np.ndarray]) -> None:
        """Keep a prompt's cache rows (copied); entries it continues are dropped, the oldest beyond capacity."""
        entry = CachedPrefix(key, [np.array(r, np.float32) for r in rows])
        if entry.nbytes > self.capacity_bytes or len(key.tokens) < MIN_REUSED:
            return
        for handle in [h for h, old in self.entries.items() if old.key.shared(key) == len(old.key.tokens)]:
            self._drop(handle)  # a prefix of this prompt (or the same prompt): this entry holds it
        self.entries[self._next] = entry
        self._next += 1
        self.size += entry.nbytes
        while self.size > self.capacity_bytes:
            self._drop(next(iter(self.entries)))

    def _drop(self, handle: int) -> None:
        self.size -= self.entries.pop(handle).nbytes
