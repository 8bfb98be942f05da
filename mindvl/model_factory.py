"""Making models: the one factory every caller uses to build a model from a recipe or load a trained one.

    create_model(config)        the model a recipe describes, sized to its data set, seeded, holding its
                                pretrained weights (what training starts from); a MultimodalLM for a
                                generative recipe (model.decoder), bound from its converted folders
    load_model(path, ...)       a trained run's model with its weights, in eval mode, plus the config it
                                belongs to and where the weights came from (what `mindvl.from_pretrained`
                                opens a run with, and eval, export, averaging, distillation, pruning and the
                                data build's alignment filter use); a checkpoint that names frozen base
                                folders gets them loaded first
    merge_lora(config, model)   the same model with its LoRA adapters folded into their weights

Both build through `mindvl.cells.build_cells`; the sizes a recipe leaves at 0 come from the data set
(`bind_config`), so a config always says exactly what was built. Training imports this module, never
the other way round.
"""
import copy
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import mindspore as ms

from mindvl.cells import MultimodalLM, MultimodalModel, build_cells
from mindvl.cells.linear import merged_state
from mindvl.chat import recipe_template
from mindvl.config import STACKS, Config, DataConfig, config_from_dict, load_config
from mindvl.data import load_meta, load_tokenizer
from mindvl.errors import CheckpointError, ConfigError, InputError
from mindvl.files import sha256_file
from mindvl.pretrained.bind import bind_pretrained, check_base, load_pretrained
from mindvl.runs import STATE_FILE, assign_state, load_model_weights, read_run_config, read_state, resolve_checkpoint


def bind_data(cfg: Config, vocab: int, answers: int) -> Config:
    """Set model.text.vocab_size and model.num_answers from the data set (0 in a recipe means exactly
    this); a recipe value that disagrees with the data is an error, not a silent resize."""
    _bind(cfg.data, cfg.model.text, "vocab_size", "model.text.vocab_size", vocab, "tokens in its tokenizer")
    _bind(cfg.data, cfg.model, "num_answers", "model.num_answers", answers, "answers")
    return cfg


def _bind(data: DataConfig, section, name: str, key: str, value: int, what: str) -> None:
    if getattr(section, name) not in (0, value):
        raise ConfigError(f"{key}: {getattr(section, name)} does not match the data in {data.root} "
                          f"({value} {what}); set it to 0 to follow the data")
    setattr(section, name, value)


def bind_config(cfg: Config) -> Config:
    """Size `cfg` to its data set and its pretrained encoders and decoder (in place; idempotent). A decoder
    trained from scratch reads the data set's word tokenizer, so its vocab_size 0 means that tokenizer's size."""
    tokenizer = load_tokenizer(cfg.data.root)
    bind_data(cfg, tokenizer.vocab_size, len(load_meta(cfg.data.root)["answers"]))
    if cfg.model.generative and not cfg.model.pretrained.decoder and not cfg.model.is_native:
        _bind(cfg.data, cfg.model.decoder, "vocab_size", "model.decoder.vocab_size", tokenizer.vocab_size,
              "tokens in its tokenizer")
    bind_pretrained(cfg)  # the converted folders exist and fit, or an error names the one that does not
    if cfg.model.generative:
        try:
            recipe_template(cfg.model)
        except InputError as exc:
            raise ConfigError(str(exc)) from exc
    return cfg


def create_model(config) -> Union[MultimodalModel, MultimodalLM]:
    """The model a recipe describes: sized to its data set and its converted folders (the config is updated in
    place), seeded with train.seed (every data-parallel rank builds the same initial weights) and holding its
    pretrained weights, frozen as model.pretrained says (projectors and LoRA adapters train); a MultimodalLM
    for a generative recipe. `config`: a Config, or anything holding one as `.config` (TrainingArguments)."""
    cfg = config if isinstance(config, Config) else config.config
    return _seeded_with_weights(cfg, lambda: build_cells(bind_config(cfg).model, cfg.preprocess))


def _seeded_with_weights(cfg: Config, build):
    """build() in graph mode under train.seed (every data-parallel rank draws the same initial weights),
    then the converted weights loaded."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(cfg.train.seed)
    model = build()
    load_pretrained(model, cfg)
    return model


def merge_lora(cfg: Config, model) -> Tuple[Config, Any]:
    """(cfg, model) with every LoRA update folded into its weight and lora_rank 0: the same function with
    plain projections (slicing, deployment, `mindvl lora merge`). The merged weights no longer match the
    converted folders, so they all travel in the model: model.pretrained's folders and cache are cleared.
    Returned unchanged when no stack has LoRA."""
    stacks = [name for name in (*STACKS, "decoder") if getattr(cfg.model, name).lora_rank]
    if not stacks:
        return cfg, model
    merged_cfg = copy.deepcopy(cfg)
    for name in stacks:
        getattr(merged_cfg.model, name).lora_rank = 0
    pretrained = merged_cfg.model.pretrained
    pretrained.vision = pretrained.text = pretrained.audio = pretrained.decoder = pretrained.vlm = pretrained.cache = ""
    merged = build_cells(merged_cfg.model, merged_cfg.preprocess)
    assign_state(merged, merged_state(model), "the LoRA-merged weights")
    merged.set_train(False)
    return merged_cfg, merged


def load_model(path, config: Optional[str] = None, overrides: Sequence[str] = (),
               data_root: Optional[str] = None) -> Tuple[Config, Any, Dict[str, Any]]:
    """(config, model in eval mode, source record) for a run folder, a step_* folder or a model.safetensors.

    Without `config` the run's own config.json is used; with it (a recipe name or YAML path, plus
    KEY=VALUE overrides) the checkpoint must fit that model exactly, else CheckpointError names the
    parameter that differs. `data_root` points the config at a data set elsewhere (a moved run). The
    source record ({"checkpoint", "sha256", "step"}) is what a model package records as its origin."""
    ms.set_context(mode=ms.GRAPH_MODE)
    weights = resolve_checkpoint(Path(path))
    cfg = load_config(config, overrides) if config else config_from_dict(read_run_config(weights))
    if data_root:
        cfg.data.root = data_root
    if config:
        bind_config(cfg)
    model = build_cells(cfg.model, cfg.preprocess)
    base = (read_state(weights.parent) if (weights.parent / STATE_FILE).is_file() else {}).get("base")
    if base:  # the checkpoint holds what trained; the frozen rest comes from the folders it names
        check_base(base, cfg.model)
        load_pretrained(model, cfg)
    try:
        state = load_model_weights(model, weights)
    except CheckpointError as exc:
        if config:
            raise CheckpointError(f"--config {config} does not match the checkpoint: {exc}") from exc
        raise
    model.set_train(False)
    return cfg, model, {"checkpoint": str(weights.resolve()), "sha256": sha256_file(weights), "step": state.get("step")}
