"""Native-resolution VLMs (Qwen2-VL, Qwen2.5-VL) converted from a Hugging Face folder into a mindvl folder
(`mindvl convert vlm --hf DIR`), and read back.

The folder:
  model.safetensors   float32 tensors under cells.native_vlm.NativeVLM's names (tower.*, decoder.*)
  config.json         {"format", "architecture" (the family), "decoder" (every DecoderConfig field), "vision"
                       (NativeVisionTower's settings and the windows' side), "patches" (the image processor's
                       PatchConfig), "video" (frames per second and frame bounds), "chat" (the template and its
                       default system turn), "tokens" (pad, stop ids), "hf" (the checkpoint's own JSON files and
                       key layout, for writing it back), "source", "files", "parameters", "mindvl"}
  tokenizer.json      the checkpoint's, unchanged
Both key layouts transformers saves are read (mindvl.pretrained.qwen2_vl); the checkpoint's chat template is
checked against the family's turns when it has one. `write_hf` writes the folder back as the checkpoint's family
(its key layout, its config, processor, generation and template files; float32 weights) for transformers, vLLM or
vllm-mindspore.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np

from mindvl.config import DecoderConfig
from mindvl.errors import ConfigError, ConversionError

FORMAT = "mindvl-vlm/1"
# the checkpoint's files kept verbatim in config.json's "hf" for write_hf (JSON, or text for the .jinja)
HF_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
            "tokenizer_config.json", "special_tokens_map.json", "chat_template.json", "chat_template.jinja")


def convert_vlm(folder: Union[str, Path], out: Union[str, Path], log=print) -> Path:
    """A Hugging Face Qwen2-VL or Qwen2.5-VL folder (config.json, *.safetensors, tokenizer.json, optionally
    preprocessor_config.json and a chat template) into a mindvl VLM folder."""
    from mindvl.preprocess.native_resolution import PatchConfig, VideoSampling

    from .llm import read_hf_folder, write_folder
    from .qwen2_vl import (checkpoint_template, family_of, key_layout, language_config, language_tensors,
                           vision_settings, vision_tensors, vision_window)

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
              "tokens": {"pad": 0 if pad is None else int(pad), "stop": stop},
              "hf": {"layout": key_layout(read.tensors), "files": _kept_files(read.path)}, "source": read.source}
    return write_folder(out, fields, tensors, read.tokenizer)


def _kept_files(folder: Path) -> Dict[str, object]:
    kept = {}
    for name in HF_FILES:
        path = folder / name
        if path.is_file():
            try:
                kept[name] = path.read_text() if name.endswith(".jinja") else json.loads(path.read_text())
            except ValueError as exc:
                raise ConversionError(f"{path}: not valid JSON ({exc})") from exc
    return kept


def write_hf(folder: Union[str, Path], out: Union[str, Path], tensors: Optional[Dict[str, np.ndarray]] = None,
             cfg: Optional[DecoderConfig] = None, tokenizer: Optional[Path] = None, log=print) -> Path:
    """A converted VLM folder written back as a Hugging Face folder of its family: model.safetensors in the key
    layout it was read from (float32, config.json's dtype saying so), tokenizer.json and the checkpoint's JSON
    files; transformers' Qwen2(.5)-VL classes load it with the logits mindvl computes. `tensors` (NativeVLM's
    names), `cfg` and `tokenizer`: a model trained from it instead of the folder's own (a fine-tuned run, LoRA
    merged: mindvl.deploy.hf_export)."""
    from safetensors.numpy import load_file, save_file

    from mindvl.files import swap_folder, work_folder

    from .llm import TOKENIZER_FILE, WEIGHTS_FILE
    from .qwen2_vl import hf_language_tensors, hf_vision_tensors

    folder, out = Path(folder), Path(out)
    config, folder_cfg = read_vlm_config(folder)
    kept = dict(config["hf"]["files"])
    if "config.json" not in kept:
        raise ConversionError(f"{folder}: converted without the checkpoint's config.json; convert it again")
    hf_config = {**kept.pop("config.json"), "torch_dtype": "float32"}
    if "dtype" in hf_config:
        hf_config["dtype"] = "float32"
    tensors = load_file(str(folder / WEIGHTS_FILE)) if tensors is None else tensors
    vision_prefix, language_prefix = config["hf"]["layout"]

    def part(prefix: str) -> Dict[str, np.ndarray]:
        return {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}

    written = {**hf_vision_tensors(part("tower."), hf_config, vision_prefix),
               **hf_language_tensors(part("decoder."), cfg or folder_cfg, language_prefix)}
    tmp = work_folder(out)
    try:
        save_file({k: np.ascontiguousarray(v, np.float32) for k, v in written.items()}, str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        (tmp / TOKENIZER_FILE).write_bytes(Path(tokenizer or folder / TOKENIZER_FILE).read_bytes())
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        for name, content in kept.items():
            (tmp / name).write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
        swap_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"-> {out}: {config['architecture']}, {len(written)} tensors in transformers' layout ({vision_prefix}*, "
        f"{language_prefix}*)")
    return out


def _processor(path: Path, kind):
    """`kind` (PatchConfig or VideoSampling) from a processor's JSON file, its defaults where there is none."""
    try:
        return kind.from_processor(json.loads(path.read_text()) if path.is_file() else {})
    except (ValueError, ConfigError) as exc:
        raise ConversionError(f"{path}: {exc}") from exc


def is_vlm_folder(folder: Union[str, Path]) -> bool:
    """A folder `mindvl convert vlm` wrote (its config.json says so)."""
    from .store import has_format

    return has_format(folder, FORMAT)


def read_vlm_config(path: Union[str, Path]) -> Tuple[Dict, DecoderConfig]:
    """(config.json, the language model's DecoderConfig) of a converted VLM folder, every file's checksum
    verified."""
    from .llm import read_decoder_folder

    return read_decoder_folder(path, FORMAT, "VLM", "`mindvl convert vlm --hf DIR --out DIR`")
