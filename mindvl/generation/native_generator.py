"""A converted native-resolution VLM (Qwen2-VL, Qwen2.5-VL: `mindvl convert vlm`) as a model that answers about
images and videos at their own resolution: `NativeGenerator.prompt` cuts the attachments as the family's
processors do (mindvl.preprocess.native_resolution), and `generate` / `stream` run them through the engine's one
decode loop (the images of a batch packed on one vision sequence, M-RoPE positions: engine.native_prompts).

    vlm = mindvl.from_pretrained("pretrained/qwen2.5-vl")
    vlm.generate(vlm.prompt("What differs?", images=["a.jpg", "b.jpg"]), max_new_tokens=64).text
    vlm.generate(vlm.prompt("What happens?", video="clip.mp4"))           # sampled at the folder's fps (2)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np

from mindvl.choices import KERNELS
from mindvl.engine.native_prompts import NativePrompt, NativePromptLayout
from mindvl.errors import InputError
from mindvl.generation.language_model import LanguageModel, decoder_kernels

if TYPE_CHECKING:
    from PIL import Image

ImageLike = Union[str, Path, np.ndarray, "Image.Image"]  # a file, or the picture


class NativeGenerator(LanguageModel):
    """A converted VLM folder with its tokenizer, processor settings and chat template, ready to generate.

    cache_len: the key/value cache's length (prompt, vision tokens included, + new tokens); kernels: mindvl.
    choices.KERNELS for the language model (LanguageModel's; the vision tower runs MindSpore's operators)."""

    def __init__(self, folder: Union[str, Path], cache_len: int = 1024, kernels: str = KERNELS.default):
        import mindspore as ms
        from mindspore.nn.utils import no_init_parameters
        from tokenizers import Tokenizer

        from mindvl.cells.decoder import CausalLM, Decode
        from mindvl.cells.native_vision import NativeVisionTower
        from mindvl.cells.native_vlm import NativePrefill, NativeVLM
        from mindvl.chat import ChatEncoder, chat_template
        from mindvl.engine.prompts import GenerationLimits
        from mindvl.generation.cell_graphs import CellGraphs
        from mindvl.preprocess.native_resolution import PatchConfig, VideoSampling
        from mindvl.pretrained.llm import TOKENIZER_FILE, load_llm_weights
        from mindvl.pretrained.vlm import read_vlm_config

        self.folder = Path(folder)
        self.config, self.cfg = read_vlm_config(self.folder)
        KERNELS.check("kernels", kernels)
        limits = GenerationLimits.for_cache(min(cache_len, self.cfg.max_positions))
        self.cache_len = limits.cache_len
        self.tokens = self.config["tokens"]
        self.stop_ids = {int(t) for t in self.tokens["stop"]}
        self.pad_id = int(self.tokens["pad"])
        self.tokenizer = Tokenizer.from_file(str(self.folder / TOKENIZER_FILE))
        self.patches = PatchConfig.from_processor(self.config["patches"])
        self.video = VideoSampling(**self.config["video"])
        vision = dict(self.config["vision"])
        window, self.tokens_per_second = vision.pop("window"), vision.pop("tokens_per_second")
        merge = vision["merge"]
        ms.set_context(mode=ms.GRAPH_MODE)
        with no_init_parameters():
            model = NativeVLM(NativeVisionTower(**vision, window_row=window * window * merge * merge),
                              CausalLM(self.cfg, self.cache_len))
        load_llm_weights(self.folder, model)
        model.set_train(False)
        decoder_kernels(model.decoder, kernels)
        self.model, self.lm = model, model.decoder
        template = dataclasses.replace(chat_template(self.config["chat"]["template"]),
                                       default_system=self.config["chat"]["default_system"])
        chat = ChatEncoder(self.tokenizer, template, 0, 0, self.pad_id)
        self.layout = NativePromptLayout(chat, limits, merge, window, window_rows=window > 0,
                                         patch_values=vision["patch_values"], stop_ids=self.stop_ids)
        self.prefill_graph = NativePrefill(model)
        self.decode_graph = Decode(model.decoder)
        self.graphs = CellGraphs(self.prefill_graph, self.decode_graph)

    def prompt(self, question: str, images: Sequence[ImageLike] = (), video=None,
               fps: Optional[float] = None) -> NativePrompt:
        """A question about images (files, PIL images or uint8 (H, W, 3) arrays, in order) and/or a video (a file,
        sampled at `fps` or the folder's rate; or its frames, a list of images taken `fps` apart), each cut at its
        own resolution. The attachments come first in the turn, as the family's processors place them."""
        from mindvl.preprocess.native_resolution import attachments

        if isinstance(images, (str, Path, np.ndarray)) or hasattr(images, "convert"):
            images = [images]
        if video is not None and not isinstance(video, (str, Path)):
            video = [_image(frame, f"video frame {i}") for i, frame in enumerate(video)]
        return NativePrompt(question, attachments([_image(image, f"images[{i}]") for i, image in enumerate(images)],
                                                  video, self.patches, self.video, self.tokens_per_second, fps))


def _image(value, name: str):
    """A file's image (Pillow), or the image or array as given."""
    if isinstance(value, (str, Path)):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(value) as picture:
                return picture.convert("RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise InputError(f"{name}: {value} is not a readable image ({exc})") from exc
    return value
