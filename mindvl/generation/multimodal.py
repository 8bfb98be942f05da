"""Answers in words from a MultimodalLM: an image and a typed or spoken question in, generated text out.

The prompt is the chat template's (mindvl.chat: the image's and the clip's slots, the question as literal
text, the opened assistant turn), left-padded to a prompt bucket like a text prompt; its prefill graph
encodes the attachments and writes their tokens into the slots (cells.multimodal_lm.MultimodalPrefill),
and the decode steps are the decoder's own, shared with text generation (LanguageModel.continue_from).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from mindvl.chat import ChatEncoder
from mindvl.config import ConfigError
from mindvl.prompting import SMALLEST_BUCKET, MultimodalPrompt, PromptLayout

from .model import LanguageModel, check_kernels

__all__ = ["MultimodalGenerator", "MultimodalPrompt", "from_run", "prompt_from_files"]


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
        self.layout = PromptLayout(chat, pre, self.buckets, self.cache_len, self.pad_id)
        model.set_train(False)
        self.multimodal_prefill = MultimodalPrefill(model)

    @staticmethod
    def is_single(prompts) -> bool:
        return isinstance(prompts, MultimodalPrompt)

    def prompt_length(self, prompt: MultimodalPrompt) -> int:
        return len(self.layout.render(prompt))

    def stream(self, prompts: Union[MultimodalPrompt, Sequence[MultimodalPrompt]], **settings) -> Iterator:
        from mindspore import Tensor

        config = self.settings(**settings)
        batch = self.layout.batch([prompts] if self.is_single(prompts) else list(prompts), config.max_new_tokens)
        logits, cache_k, cache_v = self.multimodal_prefill(*(Tensor(a) for a in (
            batch.ids, batch.valid, batch.slot_index, batch.image, batch.mel, batch.frame_mask)))
        yield from self.continue_from(logits, cache_k, cache_v, batch.valid, batch.encoded, config)


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
