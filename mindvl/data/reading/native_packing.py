"""Conversations of a native-resolution VLM packed into training rows (cells.native_vlm.NativeVLM's layout).

As ConversationPacker packs them (rows of data.packing.length tokens, a segment per conversation, labels where
the assistant speaks), with what a native model needs instead of fixed slots: each conversation's M-RoPE positions
(engine.vision_layout.mrope_positions, restarting per conversation, (R, S, 3); a 1-D decoder's positions count
on through the vision tokens, (R, S)), its vision tokens' slots pointing into the batch's images packed on one
vision sequence in conversation order, and that sequence (the tower's packing: engine.vision_layout's
WindowedPacking or ViTPacking) padded to a multiple of model.native.vision_bucket patches: graph mode compiles
once per (rows, labels, patches) met.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, VIDEO_SLOT, Rendered
from mindvl.data.reading.conversation_packing import ConversationPacker, PackedConversations
from mindvl.engine.vision_layout import ViTPacking, WindowedPacking, mrope_positions
from mindvl.errors import InputError


class NativeConversationPacker(ConversationPacker):
    """length, row_buckets, label_buckets: ConversationPacker's; vision_bucket: the patches' multiple; packing: the
    tower's (model.native); mrope: the decoder's positions are M-RoPE's."""

    def __init__(self, length: int, row_buckets: Sequence[int], label_buckets: Sequence[int], vision_bucket: int,
                 packing: Union[WindowedPacking, ViTPacking], mrope: bool = True, pad_id: int = 0,
                 audio_tokens: int = 0) -> None:
        super().__init__(length, row_buckets, label_buckets, 0, audio_tokens, pad_id)
        self.vision_bucket, self.packing, self.mrope = vision_bucket, packing, mrope

    def describe(self) -> str:
        return f"{super().describe()}, images packed in multiples of {self.vision_bucket} patches"

    def vision_size(self, grids: Sequence[Sequence[int]]) -> int:
        needed = self.packing.laid_out(grids)
        return max(-(-needed // self.vision_bucket), 1) * self.vision_bucket

    def __call__(self, batch: Sequence[Rendered], attachments: Sequence[Sequence[tuple]]
                 ) -> Tuple[PackedConversations, tuple]:
        """(the packed rows, the vision inputs) of `batch` and each conversation's attachments ((kind, patches,
        grid, time step) each, in the order of its slots). A conversation's audio slots (audio_tokens of them per
        clip, one clip at most) point at its row of the clips' tokens after the vision tokens (cells.native_vlm's
        slot table)."""
        packed = [a for items in attachments for a in items]
        size = self.vision_size([grid for _, _, grid, _ in packed])
        capacity = size // self.packing.merge ** 2
        no_slot = capacity + len(batch) * self.audio_tokens
        slots, positions, first = [], [], 0
        for index, (sample, items) in enumerate(zip(batch, attachments)):
            is_vision = np.isin(sample.kinds, (IMAGE_SLOT, VIDEO_SLOT))
            expected = sum(int(np.prod(grid)) // self.packing.merge ** 2 for _, _, grid, _ in items)
            if int(is_vision.sum()) != expected:
                raise InputError(f"conversation {index}: {int(is_vision.sum())} vision slots for attachments of "
                                 f"{expected} tokens; render it with their sizes")
            heard = np.flatnonzero(sample.kinds == AUDIO_SLOT)
            if len(heard) not in (0, self.audio_tokens):
                raise InputError(f"conversation {index}: {len(heard)} audio slots, but the model gives "
                                 f"{self.audio_tokens} tokens per clip (one clip a conversation)")
            rows = np.full(len(sample), no_slot, np.int32)
            rows[is_vision] = first + np.arange(expected)
            rows[heard] = capacity + index * self.audio_tokens + np.arange(len(heard))
            first += expected
            if self.mrope:
                vision_ids = np.unique(sample.ids[is_vision])
                place, _ = mrope_positions(sample.ids, [grid for _, _, grid, _ in items], vision_ids.tolist(),
                                           self.packing.merge, [step for *_, step in items])
                positions.append(place.T)
            else:
                positions.append(np.arange(len(sample)))
            slots.append(rows)
        vision = self.packing.inputs(packed, size, capacity)
        return self.pack(batch, slots, positions, no_slot), vision
