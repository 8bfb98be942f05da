"""Conversations packed into the generative model's training rows (layouts: cells/multimodal_lm.py).

A batch of B rendered conversations (mindvl.chat) goes into R rows of S tokens, several per row
(pack_rows, the same bin packing as the other streams), each with its own segment id and positions from
0, so a conversation attends only to itself and computes what it computes alone. Its modality slots point
into the batch's table of projected tokens (sample b's image tokens at b * image_tokens, its clip's at
B * image_tokens + b * audio_tokens, the zero row after them for text), and each position whose next
token the assistant says becomes a label: its flattened position, the token, weight 1. Row and label
counts are padded to the smallest bucket that holds them, so graph mode compiles once per bucket pair.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, Rendered, modality_slots
from mindvl.data.reading.packing import pack_rows
from mindvl.errors import InputError

CONVERSATION_COLUMNS = ("labels", "label_weight", "ids", "segment", "positions", "slot_index", "label_index")


@dataclass
class PackedConversations:
    labels: np.ndarray  # (L,) int32
    label_weight: np.ndarray  # (L,) float32
    ids: np.ndarray  # (R, S) int32
    segment: np.ndarray  # (R, S) int32
    positions: np.ndarray  # (R, S) int32
    slot_index: np.ndarray  # (R, S) int32
    label_index: np.ndarray  # (L,) int32
    useful_tokens: int

    @property
    def arrays(self) -> Tuple[np.ndarray, ...]:
        return tuple(getattr(self, name) for name in CONVERSATION_COLUMNS)

    @property
    def shape(self) -> Tuple[int, int, int]:
        """(rows, row length, labels): what a graph compiles for."""
        return self.ids.shape + self.labels.shape

    @property
    def fill(self) -> float:
        return self.useful_tokens / self.ids.size


def _bucket(needed: int, buckets: Sequence[int], what: str) -> int:
    fitting = [b for b in sorted(buckets) if b >= needed]
    if not fitting:
        raise InputError(f"conversation packing: the batch needs {needed} {what} but the largest bucket is "
                         f"{max(buckets)}; raise data.packing's buckets or lower the batch size")
    return fitting[0]


class ConversationPacker:
    """Packs a batch of rendered conversations. length: S; row_buckets and label_buckets: the R and L a
    batch may take; image_tokens/audio_tokens: the slots one attachment takes (the model's counts)."""

    def __init__(self, length: int, row_buckets: Sequence[int], label_buckets: Sequence[int], image_tokens: int,
                 audio_tokens: int, pad_id: int = 0) -> None:
        self.length = int(length)
        self.row_buckets = sorted(int(r) for r in row_buckets)
        self.label_buckets = sorted(int(n) for n in label_buckets)
        self.image_tokens = int(image_tokens)
        self.audio_tokens = int(audio_tokens)
        self.pad_id = int(pad_id)

    def describe(self) -> str:
        """The buckets, for the log."""
        return (f"conversation packing: rows of {self.length} tokens, row buckets {self.row_buckets}, "
                f"label buckets {self.label_buckets}")

    def bucket(self, lengths: Sequence[int], labels: int) -> Tuple[int, int]:
        """The (rows, labels) bucket a batch of conversations of `lengths` tokens with `labels` learnt positions
        takes: its graph."""
        return self._shape(len(pack_rows(lengths, self.length)), labels)

    def bucket_fill(self, batches: Sequence[Tuple[Sequence[int], int]]) -> Dict[str, List[Dict]]:
        """How `batches` (each: its conversations' token counts and its learnt labels) use the buckets, as
        Packer.bucket_fill says it for the classifier's streams: "conversation", per row bucket (rows x length),
        "labels", per label bucket; each entry the batches that take it (`bucket`) and the share of its slots
        they fill (tokens of rows x length, labels of the bucket's labels; None where no batch took it). The last
        of each list, what the largest batch needs (one conversation per row; the longest conversations'
        labels), is marked "padded"."""
        taken = {"conversation": {r: [0, 0] for r in self.row_buckets},
                 "labels": {n: [0, 0] for n in self.label_buckets}}
        for lengths, labels in batches:
            for name, bucket, useful in zip(taken, self.bucket(list(lengths), int(labels)), (sum(lengths), labels)):
                taken[name][bucket][0] += 1
                taken[name][bucket][1] += int(useful)
        slots = {"conversation": self.length, "labels": 1}

        def entry(name: str, bucket: int, count: int, useful: int) -> Dict:
            size = {"rows": bucket, "length": self.length} if name == "conversation" else {"labels": bucket}
            return {**size, "padded": bucket == max(taken[name]), "batches": count,
                    "fill": round(useful / (bucket * slots[name] * count), 4) if count else None}

        return {name: [entry(name, bucket, *counts) for bucket, counts in buckets.items()]
                for name, buckets in taken.items()}

    def _shape(self, rows: int, labels: int) -> Tuple[int, int]:
        return _bucket(rows, self.row_buckets, "rows"), _bucket(labels, self.label_buckets, "labels")

    def __call__(self, batch: Sequence[Rendered]) -> PackedConversations:
        count = len(batch)
        for index, sample in enumerate(batch):
            for kind, per in ((IMAGE_SLOT, self.image_tokens), (AUDIO_SLOT, self.audio_tokens)):
                if sample.count(kind) not in (0, per):
                    raise InputError(f"conversation {index}: {sample.count(kind)} "
                                     f"{'image' if kind == IMAGE_SLOT else 'audio'} slots, but the model gives "
                                     f"{per} tokens per attachment")
        return self.pack(batch, [modality_slots(s, b, count, self.image_tokens, self.audio_tokens)
                                 for b, s in enumerate(batch)],
                         [np.arange(len(s)) for s in batch], count * (self.image_tokens + self.audio_tokens))

    def pack(self, batch: Sequence[Rendered], slots: Sequence[np.ndarray], positions: Sequence[np.ndarray],
             no_slot: int) -> PackedConversations:
        """The rows of `batch` given each conversation's slot rows and positions ((n,), or (n, axes) for M-RoPE),
        `no_slot` at text and padding."""
        for index, sample in enumerate(batch):
            if len(sample) > self.length:
                raise InputError(f"conversation {index}: {len(sample)} tokens, longer than a packed row "
                                 f"({self.length}); render it with max_length={self.length}")
        bins = pack_rows([len(sample) for sample in batch], self.length)
        rows, labels_n = self._shape(len(bins), sum(int(sample.learn[1:].sum()) for sample in batch))
        shape = (rows, self.length)
        ids = np.full(shape, self.pad_id, np.int32)
        segment = np.zeros(shape, np.int32)
        place = np.zeros(shape + np.shape(positions[0])[1:], np.int32)
        slot_index = np.full(shape, no_slot, np.int32)
        label_index = np.zeros(labels_n, np.int32)
        labels = np.zeros(labels_n, np.int32)
        weight = np.zeros(labels_n, np.float32)
        written = 0
        for r, members in enumerate(bins):
            offset = 0
            for seg, b in enumerate(members, start=1):
                sample = batch[b]
                n = len(sample)
                span = slice(offset, offset + n)
                ids[r, span] = sample.ids
                segment[r, span] = seg
                place[r, span] = positions[b]
                slot_index[r, span] = slots[b]
                targets = np.flatnonzero(sample.learn[1:])  # position p predicts token p + 1
                label_index[written:written + len(targets)] = r * self.length + offset + targets
                labels[written:written + len(targets)] = sample.ids[targets + 1]
                weight[written:written + len(targets)] = 1.0
                written += len(targets)
                offset += n
        return PackedConversations(labels, weight, ids, segment, place, slot_index, label_index,
                                   int(sum(len(s) for s in batch)))
