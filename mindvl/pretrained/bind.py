"""A recipe that starts from converted encoders (model.pretrained): its model shape, checks and weights.

`bind_pretrained(cfg)` runs before the model is built: each named folder's encoder config replaces
model.<kind> (keeping the recipe's LoRA settings), and the recipe's preprocess is checked against what
the encoder was trained on, each mismatch a ConfigError naming the key and the value to use. The run's
saved config then holds the resolved shapes, so evaluation and export rebuild the model without the
folders. `load_pretrained(model, cfg)` copies the weights in (the vision positions resized to the
recipe's image size) and, with model.pretrained.freeze, fixes every encoder weight but the LoRA
adapters, so the optimizer never sees them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

from mindvl.config import AudioConfig, Config, ConfigError, VisionConfig

from .store import ConversionError, read_config

KINDS = {"vision": VisionConfig, "audio": AudioConfig}
WHISPER_FRONT_END = ("sample_rate", "n_fft", "hop_length")


def _folders(cfg: Config) -> Dict[str, Path]:
    return {kind: Path(getattr(cfg.model.pretrained, kind)) for kind in KINDS if getattr(cfg.model.pretrained, kind)}


def _read(kind: str, folder: Path) -> Dict:
    key = f"model.pretrained.{kind}"
    if not folder.is_dir():
        source = "dinov2" if kind == "vision" else "whisper-base"
        raise ConfigError(f"{key}: {folder} does not exist; create it with `mindvl convert {source} --out {folder}`")
    try:
        config = read_config(folder)
    except ConversionError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    if config["kind"] != kind:
        raise ConfigError(f"{key}: {folder} is a converted {config['kind']} encoder, not a {kind} one")
    return config


def bind_pretrained(cfg: Config) -> Config:
    """Set model.<kind> from each converted folder and check the preprocess settings against it."""
    pre = cfg.preprocess
    for kind, folder in _folders(cfg).items():
        config = _read(kind, folder)
        current = getattr(cfg.model, kind)
        setattr(cfg.model, kind, KINDS[kind](**config["encoder"], lora_rank=current.lora_rank,
                                             lora_alpha=current.lora_alpha))
        inputs = config["input"]
        if kind == "vision":
            patch = config["encoder"]["patch_size"]
            if pre.image_size % patch:
                raise ConfigError(f"preprocess.image_size: {pre.image_size} is not a multiple of the pretrained "
                                  f"encoder's patch size {patch} ({folder}); use e.g. {patch * (pre.image_size // patch)}")
            for key in ("image_mean", "image_std"):
                if [round(v, 6) for v in getattr(pre, key)] != [round(v, 6) for v in inputs[key]]:
                    raise ConfigError(f"preprocess.{key}: {getattr(pre, key)} but {folder} was trained with "
                                      f"{inputs[key]}; set preprocess.{key}: {inputs[key]}")
        else:
            for key in (*WHISPER_FRONT_END, "n_mels"):
                if getattr(pre, key) != inputs[key]:
                    raise ConfigError(f"preprocess.{key}: {getattr(pre, key)} but {folder} takes {inputs[key]}; "
                                      f"set preprocess.{key}: {inputs[key]}")
            if pre.max_audio_frames > inputs["max_frames"]:
                raise ConfigError(f"preprocess.max_audio_frames: {pre.max_audio_frames} is more than the "
                                  f"{inputs['max_frames']} frames {folder} has positions for")
    return cfg


def load_pretrained(model, cfg: Config) -> int:
    """Copy each converted encoder's weights into `model` (a MultimodalModel built from the bound config)
    and freeze them if the recipe says so; returns the number of weights loaded."""
    from mindvl.cells.linear import Linear

    from .store import from_pretrained

    loaded = 0
    for kind, folder in _folders(cfg).items():
        image_size = cfg.preprocess.image_size if kind == "vision" else None
        source = dict(from_pretrained(folder, image_size=image_size).parameters_and_names())
        target = dict(getattr(model, kind).parameters_and_names())
        adapters = {name for name in target if name.rsplit(".", 1)[-1].startswith(Linear.LORA_PREFIX)}
        if set(target) - adapters != set(source):
            raise ConfigError(f"model.pretrained.{kind}: {folder} does not fit the model's {kind} encoder "
                              f"(differing keys {sorted((set(target) - adapters) ^ set(source))[:3]})")
        for name, param in target.items():
            if name in adapters:
                continue
            param.set_data(source[name].data)
            if cfg.model.pretrained.freeze:
                param.requires_grad = False
            loaded += int(param.size)
    return loaded
