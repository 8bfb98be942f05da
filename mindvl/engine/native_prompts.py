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
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.chat import IMAGE_SLOT, VIDEO_SLOT, ChatEncoder, Turn
from mindvl.engine.prompts import GenerationLimits, PromptBatch, _Layout
from mindvl.engine.vision_layout import ViTPacking, WindowedPacking, mrope_positions
from mindvl.errors import ConfigError, InputError
from mindvl.preprocess import open_image
from mindvl.preprocess.native_resolution import IMAGE, VIDEO, PatchConfig, VideoSampling, attachments



@dataclass
class NativePrompt:
    """One question and its attachments: (kind "image" or "video", patches (n, patch_values), grid (t, h, w), the
    time step per temporal patch) each, as mindvl.preprocess.native_resolution cuts them."""

    question: str
    attachments: List[Tuple[str, np.ndarray, np.ndarray, float]] = field(default_factory=list)
    rendered: Optional[np.ndarray] = None  # its token ids, once a layout rendered them (the server does it off the engine)

    @property
    def patches(self) -> int:
        return sum(int(np.prod(grid)) for _, _, grid, _ in self.attachments)


class NativeRequests:
    """A native package's requests (files' bytes, as the server and the device pipeline receive them) as
    NativePrompts, with the package's image and video processing (its manifest's generation.native section)."""

    def __init__(self, native: dict) -> None:
        self.tokens_per_second, self.max_patches = native["tokens_per_second"], native["vision_buckets"][-1]
        self.patches = PatchConfig.from_processor(native["patches"])
        self.video = VideoSampling(**native["video"])

    def prompt(self, text: str, images: Sequence[bytes] = (), audio: Optional[bytes] = None,
               video=None) -> NativePrompt:
        """Each image decoded within the decode budget and cut at its own resolution; a video from its file's bytes
        (its header checked against the largest vision graph first) or its frames' files. CPU work: call it from a
        worker thread, never an event loop."""
        if audio is not None:
            raise InputError("audio: this model reads images and video; send the question as text")
        opened = [open_image(data, f"images[{i}]") for i, data in enumerate(images)]
        if isinstance(video, list):
            video = [open_image(data, f"video frame {i}") for i, data in enumerate(video)]
        return NativePrompt(text, attachments(opened, video, self.patches, self.video, self.tokens_per_second,
                                              max_patches=self.max_patches))


class NativePromptLayout(_Layout):
    """Renders NativePrompts with a chat encoder (its template has image and video slot tokens) and lays a batch
    out for NativePrefill. packing: how the tower takes packed images (engine.vision_layout's WindowedPacking for
    the Qwen family, ViTPacking for a ViT with a CLS token); mrope: the decoder's positions are M-RoPE's (rows,
    bucket, 3), else 1-D (rows, bucket), each token at its index; stop_ids: ids that end an answer besides the
    template's turn end (a checkpoint's end-of-text). vision_buckets: the packed patches' sizes a package's vision
    graphs take (the smallest that holds a batch's; more are refused by name); without them the patches are padded
    to a multiple of vision_bucket (the framework's graphs compile per size). The merged tokens are padded to the
    largest size's count, so the prefill graphs take one shape of vision tokens."""

    def __init__(self, chat: ChatEncoder, limits: GenerationLimits, packing: Union[WindowedPacking, ViTPacking],
                 vision_bucket: int = 64, stop_ids: Sequence[int] = (), vision_buckets: Sequence[int] = (),
                 mrope: bool = True):
        super().__init__(chat.tokenizer, limits, chat.pad_id, [chat.stop_id, *stop_ids])
        self.chat, self.packing, self.mrope = chat, packing, mrope
        self.vision_bucket = vision_bucket
        self.vision_buckets = tuple(sorted(vision_buckets))
        self.pads = {IMAGE: chat.slot_ids[IMAGE_SLOT], VIDEO: chat.slot_ids[VIDEO_SLOT]}
        self._extra_stops = tuple(stop_ids)

    def with_buckets(self, buckets: Sequence[int]) -> "NativePromptLayout":
        """This layout over other prompt buckets (one graph's bucket when export writes its samples)."""
        return self.for_graphs(self.limits.with_buckets(buckets), self.vision_buckets, self._extra_stops)

    def for_graphs(self, limits: GenerationLimits, vision_buckets: Sequence[int],
                   stop_ids: Sequence[int]) -> "NativePromptLayout":
        """This layout (its chat, packing and positions) under a package's limits, vision buckets and stop ids."""
        return NativePromptLayout(self.chat, limits, self.packing, self.vision_bucket, stop_ids, vision_buckets,
                                  self.mrope)

    def vision_size(self, prompts: Sequence[NativePrompt]) -> int:
        """The patches `prompts`' attachments take packed together (windows padded to rows), or InputError when
        no vision graph holds them."""
        needed = self.packing.laid_out([grid for p in prompts for _, _, grid, _ in p.attachments])
        if not self.vision_buckets:
            return max(-(-needed // self.vision_bucket), 1) * self.vision_bucket
        fitting = [b for b in self.vision_buckets if b >= needed]
        if not fitting:
            raise InputError(f"images: {needed:,} patches laid out, more than the {self.vision_buckets[-1]:,} this "
                             f"model's vision graphs hold; send fewer or smaller images (or a shorter video)")
        return fitting[0]

    def render(self, prompt: NativePrompt) -> np.ndarray:
        """The prompt's ids, its attachments checked against the vision graphs."""
        self.vision_size([prompt])
        return self.encode(prompt)

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, NativePrompt)

    def text_only(self, prompt: NativePrompt) -> NativePrompt:
        return NativePrompt(prompt.question)

    def encode(self, prompt: NativePrompt) -> np.ndarray:
        """The user turn: the attachments in order, then the question (as the family's processors place a
        message's content parts: nothing between them)."""
        if prompt.rendered is not None:
            return prompt.rendered
        if not prompt.question.strip() and not prompt.attachments:
            raise ConfigError("generate: no question: give the question as text")
        self.check_text(prompt.question)
        kinds = [IMAGE_SLOT if kind == IMAGE else VIDEO_SLOT for kind, *_ in prompt.attachments]
        turn = Turn("user", (*kinds, *([prompt.question] if prompt.question else [])))
        sizes = [int(np.prod(grid)) // self.packing.merge ** 2 for _, _, grid, _ in prompt.attachments]
        return self.chat.prompt([turn], images=kinds.count(IMAGE_SLOT), videos=kinds.count(VIDEO_SLOT),
                                sizes=sizes).ids

    def batch(self, prompts: Sequence[NativePrompt], max_new_tokens: int) -> PromptBatch:
        bucket, encoded = self.admit(prompts, max_new_tokens)
        ids, valid = self._left_padded(encoded, bucket)
        rows = len(prompts)
        positions = np.zeros((rows, bucket, 3) if self.mrope else (rows, bucket), np.int32)
        deltas = np.zeros(rows, np.int64)
        size = self.vision_size(prompts)
        vision = self.vision_inputs(prompts, size)
        slot_index = np.full((rows, bucket), self.capacity(size), np.int32)  # the token capacity: not a slot
        first = 0
        for row, (prompt, tokens) in enumerate(zip(prompts, encoded)):
            if self.mrope:
                grids = [grid for _, _, grid, _ in prompt.attachments]
                place, deltas[row] = mrope_positions(tokens, grids, list(self.pads.values()), self.packing.merge,
                                                     [step for *_, step in prompt.attachments])
                positions[row, bucket - len(tokens):] = place.T
            else:
                positions[row, bucket - len(tokens):] = np.arange(len(tokens))
            is_pad = np.isin(tokens, list(self.pads.values()))
            slot_index[row, bucket - len(tokens):][is_pad] = first + np.arange(int(is_pad.sum()))
            first += int(is_pad.sum())
        vision_ids = list(self.pads.values())
        return PromptBatch(ids, valid, [np.asarray(t)[~np.isin(t, vision_ids)] for t in encoded], slot_index,
                           positions=positions, deltas=deltas, vision=vision)

    def vision_inputs(self, prompts: Sequence[NativePrompt], size: int = 0) -> tuple:
        """The vision graph's inputs for `prompts`' attachments packed in order (the packing's), in `size` patches
        (0: vision_size's), the merged tokens padded to the token capacity (the largest vision bucket's; without
        buckets, this size's)."""
        size = size or self.vision_size(prompts)
        return self.packing.inputs([a for p in prompts for a in p.attachments], size, self.capacity(size))

    def capacity(self, size: int) -> int:
        """The merged tokens the vision inputs of `size` patches hold (the largest vision bucket's; without buckets,
        this size's): their count is "not a slot"."""
        return (self.vision_buckets[-1] if self.vision_buckets else size) // self.packing.merge ** 2
