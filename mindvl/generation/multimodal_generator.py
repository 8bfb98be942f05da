"""Answers in words from a MultimodalLM: an image and a typed or spoken question in, generated text out.

The prompt is the chat template's (mindvl.chat: the image's and the clip's slots, the question as literal
text, the opened assistant turn), left-padded to a prompt bucket like a text prompt (engine.prompts.
PromptLayout); its prefill graph encodes the attachments and writes their tokens into the slots
(cells.multimodal_lm.MultimodalPrefill), and the decode steps are the decoder's own, run by the engine's
loop as for text (mindvl.engine.decode_loop). Open a trained run with `mindvl.from_pretrained(run)`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence, Union

from mindvl.chat import ChatEncoder, history_turns
from mindvl.choices import KERNELS
from mindvl.engine.prompts import GenerationLimits, MultimodalPrompt, PromptLayout, preprocessed_prompt
from mindvl.errors import ConfigError
from mindvl.generation.cell_graphs import CellGraphs
from mindvl.generation.language_model import LanguageModel

__all__ = ["MultimodalGenerator", "MultimodalPrompt", "prompt_from_files"]


class MultimodalGenerator(LanguageModel):
    """Generation over a MultimodalLM's weights (trained or loaded); `chat` renders the prompts. It shares the
    model's cells, so a model still training passes kernels="standard", which leaves them (and its
    train.kernels) as they are; "auto" and "fused" swap mindvl's CPU kernels into the whole model (encoders,
    projectors and decoder, as train.kernels fused does). In these graphs MindSpore's standard operators hold
    about twice the memory: 4 prompts of vlm-s (DINOv2, Whisper base, Gemma 3 270M) peaked at 9.2 GB with
    them, 6.6 GB with only the decoder's norms, rotation and head fused (LanguageModel's choice for text),
    4.2 GB fused whole, with the same answers; 16 prompts fused whole at 7.3 GB. The decoder's cache_len is
    set to this generator's."""

    def __init__(self, model, tokenizer, chat: ChatEncoder, pre, cache_len: int = 256, kernels: str = KERNELS.default,
                 pad_id: int = 0):
        import mindspore as ms

        from mindvl.cells.decoder import Decode
        from mindvl.cells.kernels import use_kernels
        from mindvl.cells.multimodal_lm import MultimodalPrefill

        KERNELS.check("kernels", kernels)
        limits = GenerationLimits.for_cache(min(cache_len, model.decoder.cfg.max_positions))
        self.model = model
        self.lm = model.decoder
        self.cfg = model.decoder.cfg
        self.cache_len = limits.cache_len
        model.decoder.cache_len = self.cache_len  # a constant of the generation graphs only
        self.tokenizer = tokenizer
        self.chat = chat
        self.pre = pre
        self.stop_ids = {chat.stop_id}
        self.pad_id = int(pad_id)
        ms.set_context(mode=ms.GRAPH_MODE)
        # the encoders and projectors too: they run in the prefill graph
        use_kernels(model, "standard" if kernels == "standard" else "fused")
        model.set_train(False)
        self.prefill_graph = MultimodalPrefill(model)
        self.decode_graph = Decode(model.decoder)
        self.layout = PromptLayout(chat, pre, limits, self.pad_id)
        self.graphs = CellGraphs(self.prefill_graph, self.decode_graph)


def prompt_from_files(question: str, pre, image: Optional[Union[str, Path]] = None,
                      audio: Optional[Union[str, Path]] = None, history: Sequence[dict] = ()) -> MultimodalPrompt:
    """A prompt from an image file and a WAV file (either optional), preprocessed as in training; `history`: the
    conversation's earlier messages (mindvl.chat.history_turns: [{"role": "user", "content": [{"type": "image"},
    {"type": "text", "text": "What color?"}]}, {"role": "assistant", "content": "red"}]), where an image or clip
    part places the attachment in an earlier turn."""
    if not question.strip() and audio is None:
        raise ConfigError("generate: give a question, as text or as --audio")
    prompt = preprocessed_prompt(question, pre, None if image is None else _read(image, "image"),
                                 None if audio is None else _read(audio, "audio"), str(image), str(audio))
    return dataclasses.replace(prompt, history=tuple(history_turns(history)))


def _read(path: Union[str, Path], what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--{what} {path}: no such file")
    return path.read_bytes()
