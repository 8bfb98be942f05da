"""Native-resolution VLMs (Qwen2-VL, Qwen2.5-VL) converted from a Hugging Face folder into a mindvl folder
(`mindvl convert vlm --hf DIR`), and read back.

The folder:
  model.safetensors   float32 tensors under cells.native_vlm.NativeVLM's names (tower.*, decoder.*)
  config.json         {"format", "architecture" (the family), "decoder" (every DecoderConfig field), "vision"
                       (NativeVisionTower's settings and the windows' side), "patches" (the image processor's
                       PatchConfig), "video" (frames per second and frame bounds), "chat" (the template and its
                       default system turn), "tokens" (pad, stop ids), "source", "files", "parameters", "mindvl"}
  tokenizer.json      the checkpoint's, unchanged
Both key layouts transformers saves are read (mindvl.pretrained.qwen2_vl); the checkpoint's chat template is
checked against the family's turns when it has one.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, Tuple, Union

from mindvl.config import DecoderConfig, build_dataclass
from mindvl.errors import ConfigError, ConversionError

FORMAT = "mindvl-vlm/1"


def convert_vlm(folder: Union[str, Path], out: Union[str, Path], log=print) -> Path:
    """A Hugging Face Qwen2-VL or Qwen2.5-VL folder (config.json, *.safetensors, tokenizer.json, optionally
    preprocessor_config.json and a chat template) into a mindvl VLM folder."""
    from mindvl.preprocess.native_resolution import PatchConfig, VideoSampling

    from .llm import read_hf_folder, write_folder
    from .qwen2_vl import (checkpoint_template, family_of, language_config, language_tensors, vision_settings,
                           vision_tensors, vision_window)

    read = read_hf_folder(folder)
    family = family_of(read.config)
    cfg = language_config(read.config, read.path)
    patches = _processor(read.path / "preprocessor_config.json", PatchConfig)
    video = _processor(read.path / "video_preprocessor_config.json", VideoSampling)
    system, template_line = checkpoint_template(read.path, read.tokenizer)
    vision = {**vision_settings(read.config), "window": vision_window(read.config),
              "tokens_per_second": (read.config.get("vision_config") or {}).get("tokens_per_second", 0)}
    tensors = {**{f"tower.{k}": v for k, v in vision_tensors(read.tensors, read.config).items()},
               **{f"decoder.{k}": v for k, v in language_tensors(read.tensors, cfg, read.path).items()}}
    log(f"{read.path.name}: {family}, vision {vision['layers']} layers width {vision['width']}, language "
        f"{cfg.layers} layers width {cfg.width}; {template_line}")
    pad = read.config.get("pad_token_id", read.tokens.get("pad"))
    stop = sorted({int(t) for t in read.tokens["stop"]} | {read.tokenizer.token_to_id("<|im_end|>")})
    fields = {"format": FORMAT, "architecture": family, "decoder": dataclasses.asdict(cfg), "vision": vision,
              "patches": dataclasses.asdict(patches), "video": dataclasses.asdict(video),
              "chat": {"template": "qwen", "default_system": system},
              "tokens": {"pad": 0 if pad is None else int(pad), "stop": stop}, "source": read.source}
    return write_folder(out, fields, tensors, read.tokenizer)


def _processor(path: Path, kind):
    """`kind` (PatchConfig or VideoSampling) from a processor's JSON file, its defaults where there is none."""
    try:
        return kind.from_processor(json.loads(path.read_text()) if path.is_file() else {})
    except (ValueError, ConfigError) as exc:
        raise ConversionError(f"{path}: {exc}") from exc


def is_vlm_folder(folder: Union[str, Path]) -> bool:
    """A folder `mindvl convert vlm` wrote (its config.json says so)."""
    config = Path(folder) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_vlm_config(path: Union[str, Path]) -> Tuple[Dict, DecoderConfig]:
    """(config.json, the language model's DecoderConfig) of a converted VLM folder, every file's checksum
    verified."""
    from .llm import CONFIG_FILE
    from .store import read_json, verify_files

    path = Path(path)
    config_file = path / CONFIG_FILE
    config = read_json(config_file, "a converted VLM folder", "`mindvl convert vlm --hf DIR --out DIR`")
    if config.get("format") != FORMAT:
        raise ConversionError(f"{config_file}: format {config.get('format')!r} is not a mindvl VLM folder ({FORMAT}); "
                              f"convert it with `mindvl convert vlm`")
    verify_files(path, config["files"])
    try:
        cfg = build_dataclass(DecoderConfig, config["decoder"], "decoder")
        cfg.validate("decoder")
    except ConfigError as exc:
        raise ConversionError(f"{config_file}: {exc}") from exc
    return config, cfg
