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

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.chat import (AUDIO_SLOT, IMAGE_SLOT, VIDEO_SLOT, ChatEncoder, Rendered, Turn, conversation,
                         placeholder_count, user_turn)
from mindvl.engine.prompts import GenerationLimits, PromptBatch, _Layout
from mindvl.engine.vision_layout import ViTPacking, WindowedPacking, mrope_positions
from mindvl.errors import ConfigError, InputError
from mindvl.preprocess import open_image
from mindvl.preprocess.native_resolution import IMAGE, VIDEO, PatchConfig, VideoSampling, attachments



NOT_HEARD = "audio: this model reads images and video; send the question as text"  # a clip for a model that cannot hear


@dataclass
class NativePrompt:
    """One question and its attachments: (kind "image" or "video", patches (n, patch_values), grid (t, h, w), the
    time step per temporal patch) each, as mindvl.preprocess.native_resolution cuts them; for a model that hears,
    a clip as (log-mel (n_mels, T), frame mask (T,)) (mindvl.preprocess.speech_features), asked after the images."""

    question: str
    attachments: List[Tuple[str, np.ndarray, np.ndarray, float]] = field(default_factory=list)
    rendered: Optional[np.ndarray] = None  # its token ids, once a layout fitted it (the server does it off the engine)
    audio: Optional[Tuple[np.ndarray, np.ndarray]] = None
    history: Tuple[Turn, ...] = ()  # the conversation's earlier turns (chat.history_turns); their image and video
    # markers take the first attachments, in order; the question's turn the rest
    dropped: int = 0  # of which the oldest turns left out to fit (the layout's fit)

    @property
    def patches(self) -> int:
        return sum(int(np.prod(grid)) for _, _, grid, _ in self.attachments)


def in_order(found: list, history: Sequence[Turn]) -> list:
    """A question's attachments (its images, then its video: preprocess.native_resolution.attachments) in the order
    the conversation places them: the history's image and video markers first, in order, each taking the next
    image or the video; the question's turn the rest. A clip placed in the history is refused (this model hears
    one clip, in the question's turn), as is a marker with nothing to bind."""
    if placeholder_count(history, AUDIO_SLOT):
        raise InputError("history: a clip in an earlier message; this model hears a clip only in the last user "
                         "message")
    images = [a for a in found if a[0] == IMAGE]
    videos = [a for a in found if a[0] == VIDEO]
    ordered = []
    for kind in (p for turn in history for p in turn.parts if p in (IMAGE_SLOT, VIDEO_SLOT)):
        pool, what = (images, "image") if kind == IMAGE_SLOT else (videos, "video")
        if not pool:
            raise InputError(f"history: the conversation places more {what}s than the request sends; send one per "
                             f"{what} part, in order")
        ordered.append(pool.pop(0))
    return ordered + images + videos


class NativeRequests:
    """A native package's requests (files' bytes, as the server and the device pipeline receive them) as
    NativePrompts, with the package's image and video processing (its manifest's generation.native section) and,
    for a package that hears, its clips' front end (`pre`: the manifest's preprocess section)."""

    def __init__(self, native: dict, pre=None) -> None:
        self.tokens_per_second, self.max_patches = native["tokens_per_second"], native["vision_buckets"][-1]
        self.patches = PatchConfig.from_processor(native["patches"])
        self.video = VideoSampling(**native["video"])
        self.pre = pre if "speech_shape" in native else None

    def prompt(self, text: str, images: Sequence[bytes] = (), audio: Optional[bytes] = None,
               video=None, history: Sequence[Turn] = ()) -> NativePrompt:
        """Each image decoded within the decode budget and cut at its own resolution; a video from its file's bytes
        (its header checked against the largest vision graph first) or its frames' files; a clip (WAV, FLAC, OGG)
        as the model's log-mel, its length checked from its header first; the attachments in the order the
        conversation (`history`, then the question) places them. CPU work: call it from a worker thread, never an
        event loop."""
        from mindvl.preprocess import speech_features

        if audio is not None and self.pre is None:
            raise InputError(NOT_HEARD)
        heard = speech_features(audio, self.pre, name="audio") if audio is not None else None
        opened = [open_image(data, f"images[{i}]") for i, data in enumerate(images)]
        if isinstance(video, list):
            video = [open_image(data, f"video frame {i}") for i, data in enumerate(video)]
        found = attachments(opened, video, self.patches, self.video, self.tokens_per_second,
                            max_patches=self.max_patches)
        return NativePrompt(text, in_order(found, history), audio=heard, history=tuple(history))

    def decoded(self, text: str, images: Sequence = (), audio: Optional[Tuple[np.ndarray, np.ndarray]] = None
                ) -> NativePrompt:
        """A question about images already decoded (Pillow) and a clip already heard (its log-mel and frame mask):
        an evaluation's prompts (eval.generated_answers), read as a request's would be."""
        if audio is not None and self.pre is None:
            raise InputError(NOT_HEARD)
        found = attachments(list(images), None, self.patches, self.video, self.tokens_per_second,
                            max_patches=self.max_patches)
        return NativePrompt(text, found, audio=audio)


class NativePromptLayout(_Layout):
    """Renders NativePrompts with a chat encoder (its template has image and video slot tokens) and lays a batch
    out for NativePrefill. packing: how the tower takes packed images (engine.vision_layout's WindowedPacking for
    the Qwen family, ViTPacking for a ViT with a CLS token); mrope: the decoder's positions are M-RoPE's (rows,
    bucket, 3), else 1-D (rows, bucket), each token at its index; stop_ids: ids that end an answer besides the
    template's turn end (a checkpoint's end-of-text). vision_buckets: the packed patches' sizes a package's vision
    graphs take (the smallest that holds a batch's; more are refused by name); without them the patches are padded
    to a multiple of vision_bucket (the framework's graphs compile per size). The merged tokens are padded to the
    largest size's count, so the prefill graphs take one shape of vision tokens. audio_tokens: the slots a clip
    takes in a model that hears (0: none), speech_shape its log-mel's (n_mels, frames): every batch then carries a
    mel and frame mask per row (zeros without a clip), whose tokens follow the vision tokens in the slot table
    (cells.native_vlm)."""

    def __init__(self, chat: ChatEncoder, limits: GenerationLimits, packing: Union[WindowedPacking, ViTPacking],
                 vision_bucket: int = 64, stop_ids: Sequence[int] = (), vision_buckets: Sequence[int] = (),
                 mrope: bool = True, audio_tokens: int = 0, speech_shape: Tuple[int, int] = (0, 0)):
        super().__init__(chat.tokenizer, limits, chat.pad_id, [chat.stop_id, *stop_ids])
        self.chat, self.packing, self.mrope = chat, packing, mrope
        self.audio_tokens, self.speech_shape = int(audio_tokens), tuple(speech_shape)
        self.vision_bucket = vision_bucket
        self.vision_buckets = tuple(sorted(vision_buckets))
        self.pads = {IMAGE: chat.slot_ids[IMAGE_SLOT], VIDEO: chat.slot_ids[VIDEO_SLOT]}
        self.slot_ids = sorted({*self.pads.values(), *([chat.slot_ids[AUDIO_SLOT]] if audio_tokens else [])})
        self._extra_stops = tuple(stop_ids)

    def with_buckets(self, buckets: Sequence[int]) -> "NativePromptLayout":
        """This layout over other prompt buckets (one graph's bucket when export writes its samples)."""
        return self.for_graphs(self.limits.with_buckets(buckets), self.vision_buckets, self._extra_stops)

    def for_graphs(self, limits: GenerationLimits, vision_buckets: Sequence[int],
                   stop_ids: Sequence[int]) -> "NativePromptLayout":
        """This layout (its chat, packing and positions) under a package's limits, vision buckets and stop ids."""
        return NativePromptLayout(self.chat, limits, self.packing, self.vision_bucket, stop_ids, vision_buckets,
                                  self.mrope, self.audio_tokens, self.speech_shape)

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

    def packs(self, prompts: Sequence[NativePrompt]) -> bool:
        """Whether `prompts`' images and videos fit one vision graph together."""
        try:
            self.vision_size(prompts)
        except InputError:
            return False
        return True

    def render(self, prompt: NativePrompt, max_length: int = 0) -> Rendered:
        """The conversation's tokens (its history, then the question's turn: the attachments the history does not
        place, in order, then the clip, then the question: chat.user_turn, the template's separator between them,
        nothing for the Qwen family as its processors place a message's parts), the attachments it keeps checked
        against the vision graphs; with `max_length` the oldest turns are left out to fit it."""
        heard = prompt.audio is not None
        if heard and not self.audio_tokens:
            raise InputError(NOT_HEARD)
        if not prompt.question.strip() and not prompt.attachments and not heard:
            raise ConfigError("generate: no question: give the question as text" + (" or as audio" if
                                                                                   self.audio_tokens else ""))
        self.check_text(prompt.question)
        history = list(prompt.history)
        placed = sum(part in (IMAGE_SLOT, VIDEO_SLOT) for turn in history for part in turn.parts)
        if placed > len(prompt.attachments):
            raise InputError(f"history: {placed} images and videos placed, {len(prompt.attachments)} sent; send one "
                             f"per image or video part")
        self.vision_size([replace(prompt, attachments=prompt.attachments[placed:])])  # the question's own, first
        kinds = [IMAGE_SLOT if kind == IMAGE else VIDEO_SLOT for kind, *_ in prompt.attachments]
        turn = user_turn(prompt.question, kinds[placed:], heard, self.chat.template.separator)
        sizes = [int(np.prod(grid)) // self.packing.merge ** 2 for _, _, grid, _ in prompt.attachments]
        rendered = self.chat.prompt(conversation(history + [turn]), images=kinds.count(IMAGE_SLOT),
                                    audios=int(heard), videos=kinds.count(VIDEO_SLOT),
                                    sizes=sizes + [self.audio_tokens] * heard, max_length=max_length,
                                    drop_oldest=max_length > 0)
        self.vision_size([replace(prompt, attachments=prompt.attachments[rendered.dropped_attachments:])])
        return rendered

    def fit(self, prompt: NativePrompt, max_new_tokens: int = 0) -> NativePrompt:
        """The prompt with its conversation fitted (the layout's fit) and the attachments of the turns left out
        dropped too, so neither the vision graph nor the slots see them."""
        if prompt.rendered is not None:
            return prompt
        rendered = self.render(prompt, self.limits.room(max_new_tokens))
        return replace(prompt, attachments=prompt.attachments[rendered.dropped_attachments:], rendered=rendered.ids,
                       dropped=rendered.dropped)

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, NativePrompt)

    def text_only(self, prompt: NativePrompt) -> NativePrompt:
        return NativePrompt(prompt.question)

    def encode(self, prompt: NativePrompt) -> np.ndarray:
        return self.render(prompt).ids if prompt.rendered is None else prompt.rendered

    def batch(self, prompts: Sequence[NativePrompt], max_new_tokens: int) -> PromptBatch:
        bucket, encoded = self.admit(prompts, max_new_tokens)
        ids, valid = self._left_padded(encoded, bucket)
        rows = len(prompts)
        positions = np.zeros((rows, bucket, 3) if self.mrope else (rows, bucket), np.int32)
        deltas = np.zeros(rows, np.int64)
        size = self.vision_size(prompts)
        vision = self.vision_inputs(prompts, size)
        capacity = self.capacity(size)
        slot_index = np.full((rows, bucket), capacity + rows * self.audio_tokens, np.int32)  # the zero row
        first = 0
        for row, (prompt, tokens) in enumerate(zip(prompts, encoded)):
            if self.mrope:
                grids = [grid for _, _, grid, _ in prompt.attachments]
                place, deltas[row] = mrope_positions(tokens, grids, list(self.pads.values()), self.packing.merge,
                                                     [step for *_, step in prompt.attachments])
                positions[row, bucket - len(tokens):] = place.T
            else:
                positions[row, bucket - len(tokens):] = np.arange(len(tokens))
            # the slots in order: the vision tokens', then the clip's (a template whose slots all hold the pad id
            # tells them apart only by their order: the clip comes after the images)
            pads = np.flatnonzero(np.isin(tokens, self.slot_ids))
            clip = self.audio_tokens if prompt.audio is not None else 0
            seen = len(pads) - clip
            rows_of = np.concatenate([first + np.arange(seen), capacity + row * self.audio_tokens + np.arange(clip)])
            slot_index[row, bucket - len(tokens) + pads] = rows_of
            first += seen
        speech = self.speech(prompts) if self.audio_tokens else (None, None)
        return PromptBatch(ids, valid, [np.asarray(t)[~np.isin(t, self.slot_ids)] for t in encoded], slot_index,
                           mel=speech[0], frame_mask=speech[1], positions=positions, deltas=deltas, vision=vision)

    def speech(self, prompts: Sequence[NativePrompt]) -> Tuple[np.ndarray, np.ndarray]:
        """Every row's clip: mel (rows, n_mels, T) and frame mask (rows, T), zeros for a row without one."""
        mel = np.zeros((len(prompts), *self.speech_shape), np.float32)
        mask = np.zeros((len(prompts), self.speech_shape[1]), np.float32)
        for row, prompt in enumerate(prompts):
            if prompt.audio is not None:
                mel[row], mask[row] = prompt.audio
        return mel, mask

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
