"""`build_cells`: the cells of a model config with random weights (a MultimodalModel, a MultimodalLM when
the config has a decoder, a NativeVLM when it has a native-resolution tower: `native_tower`). Callers that want a model with weights use `mindvl.model_factory.create_model` (a
recipe) or `mindvl.from_pretrained` (a trained run); `count_cell_parameters` counts a built cell's (the
planner counts a config's: count_config_parameters)."""
from typing import Union

import numpy as np
from mindspore import nn

from .multimodal_lm import MultimodalLM
from .multimodal_model import MultimodalModel


def count_cell_parameters(cell: nn.Cell) -> int:
    """Elements of every parameter of a built cell, trainable or frozen."""
    return int(sum(np.prod(p.shape) for p in cell.get_parameters()))


def build_cells(model_cfg, pre_cfg, cache_len: int = 0) -> Union[MultimodalModel, MultimodalLM, nn.Cell]:
    """The cells `ModelConfig` and `PreprocessConfig` describe: a MultimodalLM for a generative config (its
    decoder's shape bound, e.g. from a converted LLM folder; `cache_len`: its generation graphs'), else a
    MultimodalModel, whose model_cfg.text.vocab_size must hold the tokenizer's size (the recipe's 0 means
    "from the data set"). A ValueError says what to bind first otherwise."""
    if model_cfg.native.layers > 0 or model_cfg.native.vit:
        from .decoder import CausalLM
        from .native_vlm import NativeVLM

        return NativeVLM(native_tower(model_cfg), CausalLM(model_cfg.decoder, cache_len), *native_audio(model_cfg, pre_cfg),
                         projector_hidden=model_cfg.projector.hidden)
    if model_cfg.generative:
        if model_cfg.decoder.layers <= 0:
            raise ValueError("model.decoder: a generative model needs its decoder's shape (layers > 0); bind it from "
                             "model.pretrained.decoder before build_cells (mindvl.model_factory does)")
        return MultimodalLM(model_cfg, pre_cfg, cache_len)
    if model_cfg.text.vocab_size <= 0:
        raise ValueError(f"model.text.vocab_size: expected the tokenizer's vocabulary size (> 0), got "
                         f"{model_cfg.text.vocab_size}; set it from the data set's tokenizer before "
                         f"build_cells (mindvl.model_factory.create_model does)")
    return MultimodalModel(model_cfg, pre_cfg)


def native_audio(model_cfg, pre_cfg) -> tuple:
    """(audio encoder, its pooling) of a native-resolution VLM that hears (model.native.audio), else (None, 1)."""
    if not model_cfg.native.audio:
        return None, 1
    from .audio import AudioEncoder
    from .multimodal_lm import audio_pooling

    audio = AudioEncoder(model_cfg.audio, pre_cfg.n_mels, pre_cfg.max_audio_frames, model_cfg.dropout)
    return audio, audio_pooling(model_cfg, pre_cfg)[0]


def native_tower(model_cfg) -> nn.Cell:
    """A native-resolution VLM's vision tower: the Qwen family's NativeVisionTower, or for model.native.family
    "dinov2" a ViTTower over model.vision (its position table bound: model.native.table) projected to the decoder's
    width."""
    from .native_vision import NativeVisionTower, ViTTower
    from .vision import PackedViT

    native = model_cfg.native
    if not native.vit:
        return NativeVisionTower(**native.tower())
    if native.table <= 0 or model_cfg.decoder.width <= 0:
        raise ValueError("model.native.table and model.decoder: a dinov2 tower needs its position table and the "
                         "decoder's width; bind them from model.pretrained.vision and .decoder before build_cells")
    vit = PackedViT(model_cfg.vision, native.table, model_cfg.dropout)
    return ViTTower(vit, model_cfg.decoder.width, native.merge, model_cfg.projector.hidden)
