"""Online packing of fusion sequences into fixed-shape rows with segment ids.

Every sample's fusion sequence is a subset of a fixed per-sample token table of `FusionLayout.length`
slots, [CLS | image | question text | audio | answer]; which slots a sample uses depends on its question
length, its clip length and which question modality it was given (text, audio or both). Padding every
sample to the whole table wastes about half of the fusion Transformer's work on easy-VQA; packing
places only the used slots of several samples one after another in `length`-token rows, with a segment
id per sample, so that attention is block-diagonal (cells/masks.py: packed_prefix_lm_mask) and each
sample computes exactly what it computes alone.

Shapes stay static: the number of rows is the smallest entry of the bucket list that holds the batch
(first-fit decreasing), so graph mode compiles once per bucket. With packing disabled the layout is the
classic one (one sample per row, every slot present, unused ones masked), so the same graph code serves
both and the benchmark compares them on equal terms.

Arrays handed to the model (B samples, R rows of S tokens, P slots per sample, La answer slots):
  pack_index (R, S) int32    slot b * P + p gathered into each row position (0 at padding)
  pack_segment (R, S) int32  1, 2, ... per sample within a row; 0 at padding
  pack_answer (R, S) float32 1 at answer slots (causal among themselves), 0 elsewhere
  cls_index (B,) int32       r * S + s of each sample's CLS in the flattened rows
  answer_index (B, La) int32 flattened row positions of each sample's answer slots
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from mindvl.config import Config, ConfigError

PACK_COLUMNS = ("pack_index", "pack_segment", "pack_answer", "cls_index", "answer_index")


@dataclass(frozen=True)
class FusionLayout:
    """Slot counts of one sample's fusion token table, in the order the fusion concatenates them."""

    image_tokens: int  # vision tokens, its CLS included
    text_tokens: int  # preprocess.max_text_length
    audio_tokens: int  # max_audio_frames / 2 (the audio encoder halves time)
    answer_tokens: int  # max_answer_length - 1 (teacher-forced inputs)

    @classmethod
    def from_config(cls, cfg: Config) -> "FusionLayout":
        pre = cfg.preprocess
        patches = (pre.image_size // cfg.model.vision.patch_size) ** 2
        return cls(patches + 1, pre.max_text_length, pre.max_audio_frames // 2, pre.max_answer_length - 1)

    @property
    def text_offset(self) -> int:
        return 1 + self.image_tokens

    @property
    def audio_offset(self) -> int:
        return self.text_offset + self.text_tokens

    @property
    def answer_offset(self) -> int:
        return self.audio_offset + self.audio_tokens

    @property
    def length(self) -> int:
        return self.answer_offset + self.answer_tokens

    def used_slots(self, question_mask: np.ndarray, audio_mask: np.ndarray, use_text: float,
                   use_audio: float) -> Tuple[np.ndarray, np.ndarray]:
        """(prefix slots, answer slots) of one sample: CLS, image, valid question tokens if the text is
        used, valid audio tokens if the audio is used; then every answer slot. An audio token is valid
        when the frame it is centred on is (the encoder's stride-2 rule, cells/audio.py)."""
        parts = [np.arange(self.text_offset)]  # the fusion CLS and the image tokens
        if use_text > 0:
            parts.append(self.text_offset + np.flatnonzero(question_mask[:self.text_tokens] > 0))
        if use_audio > 0:
            parts.append(self.audio_offset + np.flatnonzero(audio_mask[::2][:self.audio_tokens] > 0))
        prefix = np.concatenate(parts).astype(np.int32)
        answer = (self.answer_offset + np.arange(self.answer_tokens)).astype(np.int32)
        return prefix, answer


@dataclass
class PackedBatch:
    arrays: Tuple[np.ndarray, ...]  # in PACK_COLUMNS order
    rows_used: int  # rows holding at least one sample
    useful_tokens: int  # slots that hold a used token

    @property
    def fill(self) -> float:
        index = self.arrays[0]
        return self.useful_tokens / index.size


class Packer:
    """Lays out a batch's used slots in rows; see the module docstring."""

    def __init__(self, layout: FusionLayout, batch_size: int, enabled: bool = True, length: int = 128,
                 rows: Sequence[int] = ()) -> None:
        self.layout = layout
        self.batch_size = int(batch_size)
        self.enabled = bool(enabled)
        if self.enabled and length < layout.length:
            raise ConfigError(
                f"data.packing.length: {length} is shorter than the longest possible sample ({layout.length} "
                f"tokens: 1 CLS + {layout.image_tokens} image + {layout.text_tokens} text + "
                f"{layout.audio_tokens} audio + {layout.answer_tokens} answer); raise it to at least "
                f"{layout.length}")
        self.length = int(length) if self.enabled else layout.length
        buckets = [r for r in (rows or default_row_buckets(layout, self.batch_size, self.length))
                   if r < self.batch_size]
        self.rows = sorted(set(buckets)) + [self.batch_size] if self.enabled else [self.batch_size]

    @classmethod
    def from_config(cls, cfg: Config, batch_size: int = 0) -> "Packer":
        packing = cfg.data.packing
        return cls(FusionLayout.from_config(cfg), batch_size or cfg.data.batch_size, packing.enabled,
                   packing.length, packing.rows)

    def shapes(self) -> List[Tuple[int, int]]:
        """Every (rows, length) a batch can take: one graph compilation each."""
        return [(rows, self.length) for rows in self.rows]

    def __call__(self, question_mask: np.ndarray, audio_mask: np.ndarray, use_text: np.ndarray,
                 use_audio: np.ndarray) -> PackedBatch:
        batch = question_mask.shape[0]
        slots = [self.layout.used_slots(question_mask[b], audio_mask[b], use_text[b], use_audio[b])
                 for b in range(batch)]
        if not self.enabled:
            return self._padded(slots)
        sizes = [len(prefix) + len(answer) for prefix, answer in slots]
        bins = first_fit_decreasing(sizes, self.length)
        rows = next((r for r in self.rows if r >= len(bins)), None)
        if rows is None:  # more rows than the batch size can only mean one sample per row
            bins, rows = [[b] for b in range(batch)], batch
        return self._place(slots, bins, rows)

    def _padded(self, slots) -> PackedBatch:
        """One sample per row over every slot (unused ones masked): the classic padded layout."""
        batch, length = len(slots), self.layout.length
        index = np.arange(batch * length, dtype=np.int32).reshape(batch, length)
        segment = np.zeros((batch, length), np.int32)
        answer_flag = np.zeros((batch, length), np.float32)
        answer_index = np.zeros((batch, self.layout.answer_tokens), np.int32)
        for b, (prefix, answer) in enumerate(slots):
            segment[b, prefix] = 1
            segment[b, answer] = 1
            answer_flag[b, answer] = 1.0
            answer_index[b] = b * length + answer
        cls_index = np.arange(batch, dtype=np.int32) * length
        useful = int(segment.astype(bool).sum())
        return PackedBatch((index, segment, answer_flag, cls_index, answer_index), batch, useful)

    def _place(self, slots, bins: List[List[int]], rows: int) -> PackedBatch:
        length, table = self.length, self.layout.length
        index = np.zeros((rows, length), np.int32)
        segment = np.zeros((rows, length), np.int32)
        answer_flag = np.zeros((rows, length), np.float32)
        cls_index = np.zeros(len(slots), np.int32)
        answer_index = np.zeros((len(slots), self.layout.answer_tokens), np.int32)
        useful = 0
        for r, members in enumerate(bins):
            cursor = 0
            for seg, b in enumerate(sorted(members), start=1):  # row order by sample: deterministic
                prefix, answer = slots[b]
                n_prefix, n = len(prefix), len(prefix) + len(answer)
                index[r, cursor:cursor + n] = b * table + np.concatenate((prefix, answer))
                segment[r, cursor:cursor + n] = seg
                answer_flag[r, cursor + n_prefix:cursor + n] = 1.0
                cls_index[b] = r * length + cursor  # prefix[0] is slot 0, the CLS
                answer_index[b] = r * length + cursor + n_prefix + np.arange(len(answer))
                cursor += n
            useful += cursor
        return PackedBatch((index, segment, answer_flag, cls_index, answer_index), len(bins), useful)


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> List[List[int]]:
    """Bin packing: items (by index) into bins of `capacity`, longest first, ties by index."""
    bins: List[List[int]] = []
    free: List[int] = []
    for item in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, room in enumerate(free):
            if sizes[item] <= room:
                bins[b].append(item)
                free[b] -= sizes[item]
                break
        else:
            bins.append([item])
            free.append(capacity - sizes[item])
    return bins


def default_row_buckets(layout: FusionLayout, batch_size: int, length: int) -> List[int]:
    """Row buckets when the recipe names none: enough rows for a batch of average samples at ~85% and
    ~70% fill. An average sample uses about half its table (one question modality out of two, shorter
    than the maximum), measured on easy-VQA; a batch that needs more falls back to batch_size rows."""
    average = 0.5 * layout.length
    need = batch_size * average / length
    return sorted({max(1, int(np.ceil(need / fill))) for fill in (0.85, 0.7)})


class PackingStats:
    """Running packing statistics for the log: fill ratio, samples per used row, bucket use."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.samples = 0
        self.rows_used = 0
        self.useful = 0
        self.capacity = 0
        self.buckets: Dict[int, int] = {}

    def add(self, segment: np.ndarray, samples: int) -> None:
        """Count one batch from its pack_segment column (R, S) and its sample count."""
        used = segment > 0
        self.batches += 1
        self.samples += samples
        self.rows_used += int(used.any(axis=1).sum())
        self.useful += int(used.sum())
        self.capacity += used.size
        self.buckets[segment.shape[0]] = self.buckets.get(segment.shape[0], 0) + 1

    def summary(self) -> Dict[str, float]:
        return {"fill": round(self.useful / max(self.capacity, 1), 4),
                "samples_per_row": round(self.samples / max(self.rows_used, 1), 3),
                "useful_tokens_per_batch": round(self.useful / max(self.batches, 1), 1),
                "batches": self.batches, "row_buckets": dict(sorted(self.buckets.items()))}
