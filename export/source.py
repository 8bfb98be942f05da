"""Where a package's weights come from: a checkpoint, read with the config it was trained with (or one
the user names, which must then match it parameter for parameter)."""
import json
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import mindspore as ms

from mindvl.cells import create_model
from mindvl.config import Config, config_from_dict, load_config
from mindvl.eval.evaluate import find_run_config
from mindvl.train.checkpoint import CheckpointError, load_model_weights, resolve_checkpoint, sha256_file
from mindvl.train.trainer import bind_config


def load_source(checkpoint: str, config: Optional[str] = None, overrides: Sequence[str] = (),
                data_root: Optional[str] = None) -> Tuple[Config, Any, Dict[str, Any]]:
    """(config, model in eval mode, source record) for a run folder, a step_* folder or a model.safetensors.

    Without `config` the run's own config.json is used; with it (a recipe name or YAML path, plus
    KEY=VALUE overrides) the checkpoint must fit that model exactly, else CheckpointError names the
    parameter that differs."""
    ms.set_context(mode=ms.GRAPH_MODE)
    weights = resolve_checkpoint(Path(checkpoint))
    if config:
        cfg = load_config(config, overrides)
        if data_root:
            cfg.data.root = data_root
        bind_config(cfg)
    else:
        cfg = config_from_dict(json.loads(find_run_config(weights).read_text()))
        if data_root:
            cfg.data.root = data_root
    model = create_model(cfg.model, cfg.preprocess)
    try:
        state = load_model_weights(model, weights)
    except CheckpointError as exc:
        if config:
            raise CheckpointError(f"--config {config} does not match the checkpoint: {exc}") from exc
        raise
    model.set_train(False)
    return cfg, model, {"checkpoint": str(weights.resolve()), "sha256": sha256_file(weights), "step": state.get("step")}
