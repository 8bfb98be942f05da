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

from mindvl.chat import history_turns
from mindvl.choices import GENERATION_WEIGHTS, KERNELS
from mindvl.engine.native_prompts import NOT_HEARD, NativePrompt, NativePromptLayout, in_order
from mindvl.engine.vision_layout import WindowedPacking, tower_packing
from mindvl.errors import InputError
from mindvl.generation.language_model import LanguageModel, decoder_kernels

if TYPE_CHECKING:
    from PIL import Image

ImageLike = Union[str, Path, np.ndarray, "Image.Image"]  # a file, or the picture


class NativeGenerator(LanguageModel):
    """A NativeVLM with its chat encoder and processor settings, ready to generate: a converted VLM folder
    (`from_folder`, what mindvl.from_pretrained opens) or a trained native run (`from_run`).

    packing: how the tower takes packed images (engine.vision_layout's WindowedPacking or ViTPacking); cache_len:
    the key/value cache's length (prompt, vision tokens included, + new tokens); kernels: mindvl.choices.KERNELS for
    the language model (LanguageModel's; the vision tower runs MindSpore's operators); weights: mindvl.choices.
    GENERATION_WEIGHTS, the language model's products at int8 / int4 (the vision tower stays float32; "stored":
    as loaded); stop_ids: besides the chat's turn end; name, source, architecture: what a package exported from it
    records."""

    def __init__(self, model, chat, patches, video, tokens_per_second: float, packing, cache_len: int = 1024,
                 kernels: str = KERNELS.default, stop_ids: Sequence[int] = (), name: str = "vlm",
                 source: Optional[dict] = None, architecture: str = "", pre=None,
                 weights: str = GENERATION_WEIGHTS.default):
        import mindspore as ms

        from mindvl.cells.decoder import Decode
        from mindvl.cells.native_vlm import NativePrefill
        from mindvl.engine.prompts import GenerationLimits
        from mindvl.generation.cell_graphs import CellGraphs

        from mindvl.cells.quantize import quantize_model

        KERNELS.check("kernels", kernels)
        GENERATION_WEIGHTS.check("weights", weights)
        self.cfg = model.decoder.cfg
        limits = GenerationLimits.for_cache(min(cache_len, self.cfg.max_positions))
        self.cache_len = limits.cache_len
        model.decoder.cache_len = self.cache_len  # a constant of the generation graphs
        self.name, self.source, self.architecture = name, dict(source or {}), architecture
        self.chat, self.tokenizer, self.pad_id = chat, chat.tokenizer, chat.pad_id
        self.patches, self.video, self.tokens_per_second = patches, video, tokens_per_second
        ms.set_context(mode=ms.GRAPH_MODE)
        model.set_train(False)
        if weights != "stored":  # before any graph compiles: a compiled graph keeps the float products
            quantize_model(model.decoder, weights)
        self.weights = "float32" if weights == "stored" else weights
        decoder_kernels(model.decoder, kernels)
        self.model, self.lm = model, model.decoder
        self.pre = pre  # a model that hears: its clips' front end (mindvl.preprocess.speech_features)
        speech = (pre.n_mels, pre.max_audio_frames) if model.hears else (0, 0)
        self.layout = NativePromptLayout(chat, limits, packing, stop_ids=stop_ids, mrope=bool(self.cfg.mrope_section),
                                         audio_tokens=model.audio_tokens, speech_shape=speech)
        self.stop_ids = set(self.layout.stop_ids)
        self.prefill_graph = NativePrefill(model)
        self.decode_graph = Decode(model.decoder)
        self.graphs = CellGraphs(self.prefill_graph, self.decode_graph)

    @classmethod
    def from_folder(cls, folder: Union[str, Path], cache_len: int = 1024, kernels: str = KERNELS.default,
                    weights: str = GENERATION_WEIGHTS.default) -> "NativeGenerator":
        """A converted VLM folder (mindvl convert vlm): its weights, tokenizer, processor settings and chat template."""
        from mindspore.nn.utils import no_init_parameters
        from tokenizers import Tokenizer

        from mindvl.cells.decoder import CausalLM
        from mindvl.cells.native_vision import NativeVisionTower
        from mindvl.cells.native_vlm import NativeVLM
        from mindvl.chat import ChatEncoder, chat_template
        from mindvl.preprocess.native_resolution import PatchConfig, VideoSampling
        from mindvl.pretrained.llm import TOKENIZER_FILE, load_llm_weights
        from mindvl.pretrained.vlm import read_vlm_config

        folder = Path(folder)
        config, cfg = read_vlm_config(folder)
        KERNELS.check("kernels", kernels)  # before the weights load
        GENERATION_WEIGHTS.check("weights", weights)
        vision = dict(config["vision"])
        window, tokens_per_second = vision.pop("window"), vision.pop("tokens_per_second")
        with no_init_parameters():  # no random weights drawn only to be replaced
            model = NativeVLM(NativeVisionTower(**vision, window_row=window * window * vision["merge"] ** 2),
                              CausalLM(cfg, cache_len))
        load_llm_weights(folder, model)
        template = dataclasses.replace(chat_template(config["chat"]["template"]),
                                       default_system=config["chat"]["default_system"])
        chat = ChatEncoder(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), template, 0, 0, config["tokens"]["pad"])
        patches = PatchConfig.from_processor(config["patches"])
        packing = WindowedPacking(patches.merge_size, window, window > 0, patches.patch_values)
        return cls(model, chat, patches, VideoSampling(**config["video"]), tokens_per_second, packing, cache_len,
                   kernels, config["tokens"]["stop"], folder.name,
                   {"checkpoint": str(folder), "converted_from": config["source"]}, config["architecture"],
                   weights=weights)

    @classmethod
    def from_run(cls, cfg, model, cache_len: int = 1024, kernels: str = KERNELS.default,
                 source: Optional[dict] = None) -> "NativeGenerator":
        """A trained native run's model (model_factory.load_model) with its recipe's chat and processor settings."""
        from mindvl.chat import recipe_chat
        from mindvl.preprocess.native_resolution import PatchConfig, VideoSampling

        native = cfg.model.native
        return cls(model, recipe_chat(cfg, 0, model.audio_tokens), PatchConfig(**native.patches()), VideoSampling(),
                   native.tokens_per_second, tower_packing(native), cache_len, kernels, name=cfg.name, source=source,
                   architecture=native.family, pre=cfg.preprocess)

    def prompt(self, question: str, images: Sequence[ImageLike] = (), video=None,
               fps: Optional[float] = None, audio=None, history: Sequence[dict] = ()) -> NativePrompt:
        """A question about images (files, PIL images or uint8 (H, W, 3) arrays, in order) and/or a video (a file,
        sampled at `fps` or the folder's rate; or its frames, a list of images taken `fps` apart), each cut at its
        own resolution. The attachments come first in the turn, as the family's processors place them. `audio`: a
        spoken question for a model that hears (a file's path or bytes, a float32 waveform at the recipe's rate, or
        an already computed (log-mel, frame mask)). `history`: the conversation's earlier messages
        (mindvl.chat.history_turns), whose image and video parts take the first images and the video, in order."""
        from mindvl.preprocess import speech_features
        from mindvl.preprocess.native_resolution import attachments

        if isinstance(images, (str, Path, np.ndarray)) or hasattr(images, "convert"):
            images = [images]
        if video is not None and not isinstance(video, (str, Path)):
            video = [_image(frame, f"video frame {i}") for i, frame in enumerate(video)]
        if audio is not None and not isinstance(audio, tuple):
            if self.pre is None or not self.model.hears:
                raise InputError(NOT_HEARD)
            audio = speech_features(audio, self.pre, name="audio")
        turns = tuple(history_turns(history))
        found = attachments([_image(image, f"images[{i}]") for i, image in enumerate(images)], video, self.patches,
                            self.video, self.tokens_per_second, fps)
        return NativePrompt(question, in_order(found, turns), audio=audio, history=turns)


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
