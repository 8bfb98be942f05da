"""A recipe that starts from converted encoders (model.pretrained): its model shape, checks and weights.

`bind_pretrained(cfg)` runs before the model is built: each named folder's encoder config replaces
model.<kind> (keeping the recipe's LoRA settings), and the recipe's preprocess (for text: the data's
tokenizer) is checked against what the encoder was trained on, each mismatch a ConfigError naming the
key and the value to use. The run's
saved config then holds the resolved shapes, so evaluation and export rebuild the model without the
folders. `load_pretrained(model, cfg)` copies the weights in (the vision positions resized to the
recipe's image size) and, with model.pretrained.freeze, fixes every encoder weight but the LoRA
adapters, so the optimizer never sees them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, Optional, Set, Tuple

from mindvl.config import AudioConfig, Config, DataConfig, ModelConfig, PreprocessConfig, TextConfig, VisionConfig
from mindvl.errors import ConfigError, ConversionError

from .llm import load_llm_weights, read_llm_config
from .store import read_config
from .vlm import read_vlm_config

KINDS = {"vision": VisionConfig, "text": TextConfig, "audio": AudioConfig}
SOURCE_OF = {"vision": "dinov2", "text": "minilm", "audio": "whisper-base"}
WHISPER_FRONT_END = ("sample_rate", "n_fft", "hop_length")


def _folders(model_cfg: ModelConfig) -> Dict[str, Path]:
    pretrained = model_cfg.pretrained
    return {kind: Path(getattr(pretrained, kind)) for kind in KINDS if getattr(pretrained, kind)}


def _read(kind: str, folder: Path) -> Dict:
    key = f"model.pretrained.{kind}"
    if not folder.is_dir():
        raise ConfigError(f"{key}: {folder} does not exist; create it with "
                          f"`mindvl convert {SOURCE_OF[kind]} --out {folder}`")
    try:
        config = read_config(folder)
    except ConversionError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    if config["kind"] != kind:
        raise ConfigError(f"{key}: {folder} is a converted {config['kind']} encoder, not a {kind} one")
    return config


def _part(model, model_cfg: ModelConfig, kind: str):
    """(cell, its path in `model`) holding converted `kind`'s weights: model.<kind>, or a native VLM's ViT tower's
    encoder (model.native.family "dinov2": tower.vit)."""
    if kind == "vision" and model_cfg.native.vit:
        return model.tower.vit, "tower.vit"
    return getattr(model, kind), kind


def _decoder_folder(model_cfg: ModelConfig) -> Optional[Path]:
    folder = model_cfg.pretrained.decoder
    if not folder:
        return None
    if not Path(folder).is_dir():
        raise ConfigError(f"model.pretrained.decoder: {folder} does not exist; create it with `mindvl convert llm "
                          f"--out {folder}` (Gemma 3 270M from the installed weights) or `--hf DIR`")
    return Path(folder)


def _vlm_folder(model_cfg: ModelConfig) -> Optional[Path]:
    folder = model_cfg.pretrained.vlm
    if not folder:
        return None
    others = [kind for kind in ("vision", "text", "audio", "decoder") if getattr(model_cfg.pretrained, kind)]
    if others:
        raise ConfigError(f"model.pretrained.vlm: a converted VLM is the whole model; remove model.pretrained."
                          f"{others[0]}")
    if not Path(folder).is_dir():
        raise ConfigError(f"model.pretrained.vlm: {folder} does not exist; create it with `mindvl convert vlm --hf "
                          f"DIR --out {folder}` (a Qwen2-VL or Qwen2.5-VL folder)")
    return Path(folder)


def _bind_decoder(cfg: Config, key: str, read, folder: Path):
    """model.decoder from a converted folder (`read`: its reader -> (config.json, DecoderConfig)), the recipe's LoRA
    settings kept; -> what `read` returned. ConfigError naming model.pretrained.<key> when it cannot be read."""
    try:
        config, decoder = read(folder)
    except ConversionError as exc:
        raise ConfigError(f"model.pretrained.{key}: {exc}") from exc
    current = cfg.model.decoder
    cfg.model.decoder = replace(decoder, lora_rank=current.lora_rank, lora_alpha=current.lora_alpha)
    return config, decoder


def bind_vlm(cfg: Config, folder: Path) -> None:
    """model.decoder and model.native from a converted VLM's config.json (the recipe's LoRA settings kept)."""
    config, _ = _bind_decoder(cfg, "vlm", read_vlm_config, folder)
    vision, patches = config["vision"], config["patches"]
    cfg.model.native = replace(
        cfg.model.native, **{k: vision[k] for k in ("layers", "width", "heads", "mlp_width", "out_width", "patch_values",
                                                     "merge", "family", "window", "tokens_per_second")},
        full_layers=list(vision["full_layers"]), patch_size=patches["patch_size"],
        temporal_patch_size=patches["temporal_patch_size"], min_pixels=patches["min_pixels"],
        max_pixels=patches["max_pixels"], image_mean=list(patches["image_mean"]), image_std=list(patches["image_std"]),
        default_system=config["chat"]["default_system"], tokenizer=str((folder / "tokenizer.json").resolve()),
        converted=str(folder.resolve()))


def bind_pretrained(cfg: Config) -> Config:
    """Set model.<kind> (and model.decoder, or model.native and model.decoder from a VLM) from each converted
    folder and check the recipe against it."""
    vlm = _vlm_folder(cfg.model)
    if vlm is not None:
        bind_vlm(cfg, vlm)
        return cfg
    folder = _decoder_folder(cfg.model)
    if folder is not None:
        _bind_decoder(cfg, "decoder", read_llm_config, folder)
    for kind, folder in _folders(cfg.model).items():
        config = _read(kind, folder)
        current = getattr(cfg.model, kind)
        encoder = {**config["encoder"], "lora_rank": current.lora_rank, "lora_alpha": current.lora_alpha}
        if kind == "text":  # the data's tokenizer may add [BOS]/[EOS] after the encoder's vocabulary
            encoder["vocab_size"] = current.vocab_size
            _check_tokenizer(cfg.data, folder)
        elif kind == "vision" and cfg.model.native.vit:
            _bind_vit_tower(cfg, folder, config)
        else:
            _PREPROCESS_CHECKS[kind](cfg.preprocess, folder, config)
        setattr(cfg.model, kind, KINDS[kind](**encoder))
    return cfg


def _bind_vit_tower(cfg: Config, folder: Path, config: Dict) -> None:
    """model.native of a dinov2 tower from its converted encoder: the position table's side, the patch and its
    values; the recipe's normalisation checked against the encoder's."""
    inputs, patch = config["input"], int(config["encoder"]["patch_size"])
    native = cfg.model.native
    for key in ("image_mean", "image_std"):
        if [round(v, 6) for v in getattr(native, key)] != [round(v, 6) for v in inputs[key]]:
            raise ConfigError(f"model.native.{key}: {getattr(native, key)} but {folder} was trained with "
                              f"{inputs[key]}; set model.native.{key}: {inputs[key]}")
    cfg.model.native = replace(native, table=int(inputs["image_size"]) // patch, patch_size=patch,
                               patch_values=3 * patch * patch)


def _check_vision(pre: PreprocessConfig, folder: Path, config: Dict) -> None:
    inputs, patch = config["input"], config["encoder"]["patch_size"]
    if pre.image_size % patch:
        raise ConfigError(f"preprocess.image_size: {pre.image_size} is not a multiple of the pretrained "
                          f"encoder's patch size {patch} ({folder}); use e.g. {patch * (pre.image_size // patch)}")
    for key in ("image_mean", "image_std"):
        if [round(v, 6) for v in getattr(pre, key)] != [round(v, 6) for v in inputs[key]]:
            raise ConfigError(f"preprocess.{key}: {getattr(pre, key)} but {folder} was trained with "
                              f"{inputs[key]}; set preprocess.{key}: {inputs[key]}")


def _check_audio(pre: PreprocessConfig, folder: Path, config: Dict) -> None:
    inputs = config["input"]
    for key in (*WHISPER_FRONT_END, "n_mels"):
        if getattr(pre, key) != inputs[key]:
            raise ConfigError(f"preprocess.{key}: {getattr(pre, key)} but {folder} takes {inputs[key]}; "
                              f"set preprocess.{key}: {inputs[key]}")
    if pre.max_audio_frames > inputs["max_frames"]:
        raise ConfigError(f"preprocess.max_audio_frames: {pre.max_audio_frames} is more than the "
                          f"{inputs['max_frames']} frames {folder} has positions for")


def _check_tokenizer(data: DataConfig, folder: Path) -> None:
    """The data must be tokenised with the encoder's own tokenizer: same tokens, same ids."""
    from tokenizers import Tokenizer

    data_file = Path(data.root) / "tokenizer.json"
    ours = Tokenizer.from_file(str(data_file)).get_vocab(with_added_tokens=True)
    theirs = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)
    if any(ours.get(token) != i for token, i in theirs.items()):
        raise ConfigError(f"data.tokenizer: the data in {data.root} was not tokenised with {folder}'s tokenizer; "
                          f"rebuild it with `mindvl data build --config <recipe> --set data.tokenizer={folder} "
                          f"--force`")


# what an encoder's inputs need of the recipe's preprocess (the text encoder's need of the data: _check_tokenizer)
_PREPROCESS_CHECKS = {"vision": _check_vision, "audio": _check_audio}


def load_pretrained(model, cfg: Config) -> int:
    """Copy each converted encoder's weights (and the decoder's) into `model` (a MultimodalModel or a
    MultimodalLM built from the bound config) and freeze them if the recipe says so; returns the number of
    weights loaded."""
    import numpy as np
    from mindspore import Tensor

    from mindvl.cells.linear import is_adapter

    from .store import load_converted

    loaded = 0
    for kind, folder in _folders(cfg.model).items():
        image_size = cfg.preprocess.image_size if kind == "vision" and not cfg.model.native.vit else None
        source = dict(load_converted(folder, image_size=image_size).parameters_and_names())
        target = dict(_part(model, cfg.model, kind)[0].parameters_and_names())
        adapters = {name for name in target if is_adapter(name)}
        if set(target) - adapters != set(source):
            raise ConfigError(f"model.pretrained.{kind}: {folder} does not fit the model's {kind} encoder "
                              f"(differing keys {sorted((set(target) - adapters) ^ set(source))[:3]})")
        for name, param in target.items():
            if name in adapters:
                continue
            value = source[name].asnumpy()
            if value.shape != tuple(param.shape):
                if name != "word_embeddings.weight" or value.shape[1:] != tuple(param.shape[1:]) \
                        or value.shape[0] > param.shape[0]:
                    raise ConfigError(f"model.pretrained.{kind}: {folder} holds {name} of shape {value.shape}, the "
                                      f"model's is {tuple(param.shape)}")
                # tokens the data's tokenizer added ([BOS], [EOS]) keep their fresh rows: the encoder never sees them
                value = np.concatenate([value, param.asnumpy()[value.shape[0]:]])
            param.set_data(Tensor(value))
            if cfg.model.pretrained.freeze:
                param.requires_grad = False
            loaded += int(param.size)
    folder = _decoder_folder(cfg.model)
    whole = _vlm_folder(cfg.model)
    if folder is not None or whole is not None:
        cell = model.decoder if folder is not None else model  # a VLM's folder holds tower.* and decoder.*
        load_llm_weights(folder or whole, cell)
        for name, param in cell.parameters_and_names():
            if not is_adapter(name):
                if cfg.model.pretrained.freeze:
                    param.requires_grad = False
                loaded += int(param.size)
    return loaded


def base_weights(model, model_cfg: ModelConfig) -> Tuple[Dict[str, Dict], Set[str]]:
    """(record, names): the converted folders whose weights `model` holds frozen and unchanged, each with the
    sha256 of its files (from its config.json, verified), and the paths of those parameters in `model`.
    A checkpoint stores everything else (projectors, LoRA adapters, any unfrozen part) and this record, so
    it stays small and still names exactly what it needs (mindvl.runs.load_model_weights). Empty without
    model.pretrained.freeze: then every weight trains and is stored."""
    from mindvl.cells.linear import is_adapter

    record: Dict[str, Dict] = {}
    names: Set[str] = set()
    if not model_cfg.pretrained.freeze:
        return record, names
    parts = {kind: (folder, read_config(folder)) for kind, folder in _folders(model_cfg).items()}
    folder = _decoder_folder(model_cfg)
    if folder is not None:
        parts["decoder"] = (folder, read_llm_config(folder)[0])
    whole = _vlm_folder(model_cfg)
    if whole is not None:  # one folder, both parts
        config = read_vlm_config(whole)[0]
        parts.update({"tower": (whole, config), "decoder": (whole, config)})
    for kind, (folder, config) in parts.items():
        cell, path = _part(model, model_cfg, kind)
        record[kind] = {"folder": str(folder.resolve()), "files": dict(config["files"]), "path": path}
        names |= {f"{path}.{name}" for name, param in cell.parameters_and_names()
                  if not is_adapter(name) and not param.requires_grad}
    return record, names


def check_base(record: Dict[str, Dict], model_cfg: ModelConfig) -> None:
    """The converted folders `model_cfg` binds (model.pretrained) are the ones a checkpoint's base `record`
    names, with the same files: else a ConfigError naming the part, both identities and what to do."""
    folders = {**{kind: str(folder) for kind, folder in _folders(model_cfg).items()},
               **({"decoder": str(_decoder_folder(model_cfg))} if model_cfg.pretrained.decoder else {}),
               **({"tower": model_cfg.pretrained.vlm, "decoder": model_cfg.pretrained.vlm}
                  if model_cfg.pretrained.vlm else {})}
    for kind, expected in record.items():
        if kind not in folders:
            raise ConfigError(f"model.pretrained.{kind}: the checkpoint was trained on the frozen {kind} weights of "
                              f"{expected['folder']}, which this config does not name; set it to that folder")
        folder = Path(folders[kind])
        try:
            files = (read_vlm_config(folder)[0] if model_cfg.pretrained.vlm else read_llm_config(folder)[0]
                     if kind == "decoder" else read_config(folder))["files"]
        except ConversionError as exc:
            raise ConfigError(f"model.pretrained.{kind}: {exc}") from exc
        if files != expected["files"]:
            raise ConfigError(f"model.pretrained.{kind}: {folder} holds other weights than the checkpoint was "
                              f"trained on ({expected['folder']}, sha256 {expected['files']}); point it at the "
                              f"same converted folder (or convert the same source again)")

