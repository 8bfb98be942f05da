"""`build_cells`: the cells of a MultimodalModel from its config, with random weights; `build_generative_cells`:
a MultimodalLM's. Callers that want a
model with weights use `mindvl.models.create_model` (a recipe) or `load_model` (a trained run).
`count_cell_parameters` counts a built cell's (the planner counts a config's: count_config_parameters)."""
import numpy as np
from mindspore import nn

from .model import MultimodalModel
from .multimodal_lm import MultimodalLM


def count_cell_parameters(cell: nn.Cell) -> int:
    """Elements of every parameter of a built cell, trainable or frozen."""
    return int(sum(np.prod(p.shape) for p in cell.get_parameters()))


def build_cells(model_cfg, pre_cfg) -> MultimodalModel:
    """Build a MultimodalModel from `ModelConfig` and `PreprocessConfig`.

    model_cfg.text.vocab_size must already hold the tokenizer's size (the recipe's 0 means "from the
    data set"); a ValueError says so otherwise.
    """
    if model_cfg.text.vocab_size <= 0:
        raise ValueError(f"model.text.vocab_size: expected the tokenizer's vocabulary size (> 0), got "
                         f"{model_cfg.text.vocab_size}; set it from the data set's tokenizer before "
                         f"build_cells (mindvl.models.create_model does)")
    return MultimodalModel(model_cfg, pre_cfg)


def build_generative_cells(model_cfg, pre_cfg, cache_len: int = 0) -> MultimodalLM:
    """Build a MultimodalLM from a generative `ModelConfig` (model.decoder set, e.g. bound from a converted
    LLM folder) and `PreprocessConfig`."""
    if model_cfg.decoder.layers <= 0:
        raise ValueError("model.decoder: a generative model needs its decoder's shape (layers > 0); bind it from "
                         "model.pretrained.decoder before build_generative_cells (mindvl.models does)")
    return MultimodalLM(model_cfg, pre_cfg, cache_len)
