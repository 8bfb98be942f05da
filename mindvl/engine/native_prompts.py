"""Prompts of a native-resolution VLM (Qwen2-VL, Qwen2.5-VL) as its prefill graph's inputs: each image (or video)
takes as many tokens as its patch grid makes, the images of a whole batch are packed on one vision sequence, and
every token gets its M-RoPE positions.

A prompt renders through the chat encoder (mindvl.chat, the "qwen" template: `<|im_start|>user\\n` + per image
`<|vision_start|>` + its `<|image_pad|>` tokens + `<|vision_end|>` + the question + `<|im_end|>\\n<|im_start|>
assistant\\n`, video with `<|video_pad|>`, after the checkpoint's default system turn where it has one); a batch is left-padded to its bucket like every prompt (engine.prompts), the padding at
position 0, and `slot_index` points each pad token at its row of the packed vision tokens (the batch's images
in order, each in the processor's order).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import numpy as np

from mindvl.chat import IMAGE_SLOT, VIDEO_SLOT, ChatEncoder, Turn
from mindvl.engine.prompts import GenerationLimits, PromptBatch, _Layout
from mindvl.engine.vision_layout import mrope_positions, vision_layout
from mindvl.errors import ConfigError

IMAGE, VIDEO = "image", "video"


@dataclass
class NativePrompt:
    """One question and its attachments: (kind "image" or "video", patches (n, patch_values), grid (t, h, w), the
    time step per temporal patch) each, as mindvl.preprocess.native_resolution cuts them."""

    question: str
    attachments: List[Tuple[str, np.ndarray, np.ndarray, float]] = field(default_factory=list)


class NativePromptLayout(_Layout):
    """Renders NativePrompts with a chat encoder (its template has image and video slot tokens) and lays a batch
    out for NativePrefill. window: the tower's windows in merged blocks (0: none); window_rows: pad windows to
    rows (the tower's window_row); vision_bucket: the packed patches are padded to a multiple of it; stop_ids: ids
    that end an answer besides the template's turn end (a checkpoint's end-of-text)."""

    def __init__(self, chat: ChatEncoder, limits: GenerationLimits, merge: int = 2, window: int = 0,
                 window_rows: bool = False, vision_bucket: int = 64, patch_values: int = 1176,
                 stop_ids: Sequence[int] = ()):
        super().__init__(chat.tokenizer, limits, chat.pad_id, [chat.stop_id, *stop_ids])
        self.chat = chat
        self.patch_values = patch_values
        self.merge, self.window, self.window_rows, self.vision_bucket = merge, window, window_rows, vision_bucket
        self.pads = {IMAGE: chat.slot_ids[IMAGE_SLOT], VIDEO: chat.slot_ids[VIDEO_SLOT]}

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, NativePrompt)

    def encode(self, prompt: NativePrompt) -> np.ndarray:
        """The user turn: the attachments in order, then the question (as the family's processors place a
        message's content parts: nothing between them)."""
        if not prompt.question.strip() and not prompt.attachments:
            raise ConfigError("generate: no question: give the question as text")
        self.check_text(prompt.question)
        kinds = [IMAGE_SLOT if kind == IMAGE else VIDEO_SLOT for kind, *_ in prompt.attachments]
        turn = Turn("user", (*kinds, *([prompt.question] if prompt.question else [])))
        sizes = [int(np.prod(grid)) // self.merge ** 2 for _, _, grid, _ in prompt.attachments]
        return self.chat.prompt([turn], images=kinds.count(IMAGE_SLOT), videos=kinds.count(VIDEO_SLOT),
                                sizes=sizes).ids

    def batch(self, prompts: Sequence[NativePrompt], max_new_tokens: int) -> PromptBatch:
        bucket, encoded = self.admit(prompts, max_new_tokens)
        ids, valid = self._left_padded(encoded, bucket)
        rows = len(prompts)
        positions = np.zeros((rows, bucket, 3), np.int32)
        deltas = np.zeros(rows, np.int64)
        attachments = [a for p in prompts for a in p.attachments]
        # with no image in the batch, one empty vision row stands in (the graph's inputs are fixed), its token unused
        total = sum(int(np.prod(grid)) // self.merge ** 2 for _, _, grid, _ in attachments) or 1
        slot_index = np.full((rows, bucket), total, np.int32)
        first = 0
        for row, (prompt, tokens) in enumerate(zip(prompts, encoded)):
            grids = [grid for _, _, grid, _ in prompt.attachments]
            place, deltas[row] = mrope_positions(tokens, grids, list(self.pads.values()), self.merge,
                                                 [step for *_, step in prompt.attachments])
            positions[row, bucket - len(tokens):] = place.T
            is_pad = np.isin(tokens, list(self.pads.values()))
            slot_index[row, bucket - len(tokens):][is_pad] = first + np.arange(int(is_pad.sum()))
            first += int(is_pad.sum())
        if attachments:
            layout = vision_layout([grid for _, _, grid, _ in attachments], self.merge, self.window,
                                   self.window_rows)
            size = -(-layout.patches // self.vision_bucket) * self.vision_bucket
            vision = layout.graph_inputs(np.concatenate([patches for _, patches, _, _ in attachments]), size)
        else:
            width = self.vision_bucket
            vision = (np.zeros((1, width, self.patch_values), np.float32), np.zeros((1, width, 2), np.int32),
                      np.zeros((1, width), np.int32), np.zeros((1, width), np.int32), np.zeros(1, np.int32))
        return PromptBatch(ids, valid, [np.asarray(t) for t in encoded], slot_index, positions=positions,
                           deltas=deltas, vision=vision)
