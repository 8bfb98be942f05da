"""Answers in words from a MultimodalLM: an image and a typed or spoken question in, generated text out.

The prompt is the chat template's (mindvl.chat: the image's and the clip's slots, the question as literal
text, the opened assistant turn), left-padded to a prompt bucket like a text prompt; its prefill graph
encodes the attachments and writes their tokens into the slots (cells.multimodal_lm.MultimodalPrefill),
and the decode steps are the decoder's own, shared with text generation (LanguageModel.continue_from).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from mindvl.chat import ChatEncoder, question_turn
from mindvl.config import ConfigError
from mindvl.data.conversations import modality_slots

from .model import SMALLEST_BUCKET, LanguageModel, check_kernels


@dataclass
class MultimodalPrompt:
    """One question: its text (may be empty when spoken), the image (3, H, W) float32 as
    mindvl.preprocess normalises it, the clip's log-mel (n_mels, T) and frame mask (T,) (pad_mel)."""

    question: str = ""
    image: Optional[np.ndarray] = None
    mel: Optional[np.ndarray] = None
    frame_mask: Optional[np.ndarray] = None


class MultimodalGenerator(LanguageModel):
    """Generation over a MultimodalLM's weights (trained or loaded); `chat` renders the prompts. It shares the
    model's cells: kernels defaults to "standard", which leaves them as they are, so a model still training
    keeps its train.kernels; "fused" swaps mindvl's CPU kernels into the whole model (encoders, projectors
    and decoder, as train.kernels fused does). In these graphs MindSpore's standard operators hold about
    twice the memory: 4 prompts of vlm-s (DINOv2, Whisper base, Gemma 3 270M) peaked at 9.2 GB with them,
    6.6 GB with only the decoder's norms, rotation and head fused (LanguageModel's choice for text), 4.2 GB
    fused whole, with the same answers; 16 prompts fused whole at 7.3 GB. The decoder's cache_len is set to
    this generator's."""

    def __init__(self, model, tokenizer, chat: ChatEncoder, pre, cache_len: int = 256, kernels: str = "standard",
                 pad_id: int = 0):
        import mindspore as ms

        from mindvl.cells.multimodal_lm import MultimodalPrefill

        if cache_len <= SMALLEST_BUCKET:
            raise ConfigError(f"cache_len: expected more than {SMALLEST_BUCKET} tokens, got {cache_len}")
        self.model = model
        self.cfg = model.decoder.cfg
        self.cache_len = min(cache_len, self.cfg.max_positions)
        model.decoder.cache_len = self.cache_len  # a constant of the generation graphs only
        self.tokenizer = tokenizer
        self.chat = chat
        self.pre = pre
        self.stop_ids = {chat.stop_id}
        self.pad_id = int(pad_id)
        from mindvl.cells.kernels import use_kernels

        check_kernels(kernels)
        ms.set_context(mode=ms.GRAPH_MODE)
        use_kernels(model, kernels)  # the encoders and projectors too: they run in the prefill graph
        self._ready(model.decoder, kernels)
        model.set_train(False)
        self.multimodal_prefill = MultimodalPrefill(model)

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, MultimodalPrompt)

    def prompt_length(self, prompt: MultimodalPrompt) -> int:
        return len(self._render(prompt))

    def _render(self, prompt: MultimodalPrompt):
        image, audio = prompt.image is not None, prompt.mel is not None
        turn = question_turn(prompt.question, image=image, audio=audio)
        return self.chat.prompt([turn], images=int(image), audios=int(audio))

    def stream(self, prompts: Union[MultimodalPrompt, Sequence[MultimodalPrompt]], **settings) -> Iterator:
        from mindspore import Tensor

        config = self.settings(**settings)
        prompts = [prompts] if self.is_single(prompts) else list(prompts)
        if not prompts:
            raise ConfigError("generate: no prompt given")
        rendered = [self._render(p) for p in prompts]
        batch, longest = len(rendered), max(len(r) for r in rendered)
        bucket = self._bucket(longest, config.max_new_tokens)
        model = self.model
        table = batch * (model.image_tokens + model.audio_tokens)  # the zero row's index
        ids = np.full((batch, bucket), self.pad_id, np.int32)
        valid = np.zeros((batch, bucket), bool)
        slot_index = np.full((batch, bucket), table, np.int32)
        size = self.pre.image_size
        image = np.zeros((batch, 3, size, size), np.float32)
        mel = np.zeros((batch, self.pre.n_mels, self.pre.max_audio_frames), np.float32)
        frame_mask = np.zeros((batch, self.pre.max_audio_frames), np.float32)
        for row, (prompt, r) in enumerate(zip(prompts, rendered)):
            start = bucket - len(r)
            ids[row, start:] = r.ids
            valid[row, start:] = True
            slot_index[row, start:] = modality_slots(r, row, batch, model.image_tokens, model.audio_tokens)
            if prompt.image is not None:
                image[row] = prompt.image
            if prompt.mel is not None:
                mel[row], frame_mask[row] = prompt.mel, prompt.frame_mask
        logits, cache_k, cache_v = self.multimodal_prefill(Tensor(ids), Tensor(valid), Tensor(slot_index),
                                                           Tensor(image), Tensor(mel), Tensor(frame_mask))
        encoded = [r.ids[r.kinds == 0] for r in rendered]
        yield from self.continue_from(logits, cache_k, cache_v, valid, encoded, config)


def from_run(path: Union[str, Path], cache_len: int = 256, kernels: str = "fused") -> MultimodalGenerator:
    """A trained generative run (its folder, a step_* folder or its model.safetensors) as a generator: the
    checkpoint's MultimodalLM with the recipe's chat template and tokenizer (mindvl.chat.recipe_chat)."""
    from mindvl.chat import recipe_chat
    from mindvl.models import load_model

    cfg, model, _ = load_model(path)
    if not cfg.model.generative:
        raise ConfigError(f"{path}: a classifier run (no model.decoder) answers with `mindvl serve` or "
                          f"`mindvl eval`, not by generating; train a generative recipe (e.g. vlm-tiny)")
    chat = recipe_chat(cfg, model.image_tokens, model.audio_tokens)
    return MultimodalGenerator(model, chat.tokenizer, chat, cfg.preprocess, cache_len, kernels)


def prompt_from_files(question: str, pre, image: Optional[Union[str, Path]] = None,
                      audio: Optional[Union[str, Path]] = None) -> MultimodalPrompt:
    """A prompt from an image file and a WAV file (either optional), preprocessed as in training."""
    from mindvl import preprocess as P

    pixels = mel = mask = None
    if image is not None:
        pixels = P.decode_image(_read(image, "image"), pre, name=str(image))
    if audio is not None:
        mel, mask = P.pad_mel(P.log_mel(P.load_wav(_read(audio, "audio"), pre.sample_rate, name=str(audio)), pre,
                                        name=str(audio)), pre, name=str(audio))
    if not question.strip() and audio is None:
        raise ConfigError("generate: give a question, as text or as --audio")
    return MultimodalPrompt(question, pixels, mel, mask)


def _read(path: Union[str, Path], what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--{what} {path}: no such file")
    return path.read_bytes()
