"""`create_model`: the one way callers (trainer, export, eval) build the model from config."""
from .model import MultimodalModel


def create_model(model_cfg, pre_cfg) -> MultimodalModel:
    """Build a MultimodalModel from `ModelConfig` and `PreprocessConfig`.

    model_cfg.text.vocab_size must already hold the tokenizer's size (the recipe's 0 means "from the
    data set"); a ValueError says so otherwise.
    """
    if model_cfg.text.vocab_size <= 0:
        raise ValueError(f"model.text.vocab_size: expected the tokenizer's vocabulary size (> 0), got "
                         f"{model_cfg.text.vocab_size}; set it from the data set's tokenizer before "
                         f"create_model")
    return MultimodalModel(model_cfg, pre_cfg)
