"""Hugging Face Qwen2-VL and Qwen2.5-VL checkpoints as mindvl's cells: the vision tower's settings and tensors
(cells.native_vision.NativeVisionTower), the language model's DecoderConfig (Qwen2 with M-RoPE: the family entries
in mindvl.pretrained.families) and tensors (cells.decoder.CausalLM), and the chat's special tokens.

transformers saves the tower's keys as `visual.*` (before 4.52, and 5.x's save_pretrained) or `model.visual.*`
(4.52-4.5x), the language model's `model.layers.*` or `model.language_model.layers.*`: both are read. The Conv3d patch embedding (out, 3, 2, 14, 14) is the MatMul's (out, 1176) weight
flattened in the processor's patch order (channel, time, row, column); the fused qkv projection is split into
q, k and v.
"""
import json
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from mindvl.config import DecoderConfig
from mindvl.errors import ConversionError

FAMILIES = ("qwen2_5_vl", "qwen2_vl")
VISION_PREFIXES = ("model.visual.", "visual.")


def family_of(config: dict) -> str:
    """The family of a checkpoint's config.json (`model_type`), refused by name when it is another."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ConversionError(f"config.json: model_type {family!r} is not a native-resolution VLM this converter "
                              f"reads; expected one of {', '.join(FAMILIES)}")
    return family


def vision_window(config: dict) -> int:
    """The windowed layers' side in merged blocks (window_size / merge / patch: 4), 0 for Qwen2-VL (no windows):
    what the host's vision_layout takes."""
    vision = config.get("vision_config") or {}
    if family_of(config) != "qwen2_5_vl":
        return 0
    return vision.get("window_size", 112) // vision.get("spatial_merge_size", 2) // vision.get("patch_size", 14)


def vision_settings(config: dict) -> dict:
    """NativeVisionTower's keyword settings from a checkpoint's config.json."""
    family = family_of(config)
    vision = config.get("vision_config") or {}
    if family == "qwen2_5_vl":
        width, mlp_width = vision["hidden_size"], vision["intermediate_size"]
        out_width, full_layers = vision["out_hidden_size"], tuple(vision.get("fullatt_block_indexes", ()))
        if vision.get("hidden_act", "silu") != "silu":
            raise ConversionError(f"vision_config.hidden_act {vision['hidden_act']!r}: only silu is supported")
    else:
        full_layers = ()
        width, out_width = vision["embed_dim"], vision["hidden_size"]
        mlp_width = int(width * vision.get("mlp_ratio", 4))
        if vision.get("hidden_act", "quick_gelu") != "quick_gelu":
            raise ConversionError(f"vision_config.hidden_act {vision['hidden_act']!r}: only quick_gelu is supported")
    merge, patch, temporal = (vision.get("spatial_merge_size", 2), vision.get("patch_size", 14),
                              vision.get("temporal_patch_size", 2))
    return {"width": width, "layers": vision["depth"], "heads": vision["num_heads"], "mlp_width": mlp_width,
            "out_width": out_width, "patch_values": vision.get("in_channels", 3) * temporal * patch * patch,
            "merge": merge, "full_layers": full_layers, "family": family}


def _vision_part(tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    for prefix in VISION_PREFIXES:
        found = {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}
        if found:
            return found
    raise ConversionError(f"the checkpoint holds no vision tower (no key starts with {' or '.join(VISION_PREFIXES)})")


def _vision_names(settings: dict, present) -> Dict[str, str]:
    """NativeVisionTower's names -> the checkpoint's (after the tower's prefix), for every tensor taken whole
    (the fused qkv and the patch embedding are reshaped, not renamed). `present`: a checkpoint name's test, for
    the norms one family has and the other has not."""
    mlp = ({"gate": "gate_proj", "fc1": "up_proj", "fc2": "down_proj"} if settings["family"] == "qwen2_5_vl"
           else {"fc1": "fc1", "fc2": "fc2"})
    names = {}
    for kind in ("weight", "bias"):
        for layer in range(settings["layers"]):
            block = f"blocks.{layer}."
            names[f"{block}attn.out_proj.{kind}"] = f"{block}attn.proj.{kind}"
            names.update({f"{block}mlp.{ours}.{kind}": f"{block}mlp.{theirs}.{kind}" for ours, theirs in mlp.items()})
            names.update({f"{block}{norm}.{kind}": f"{block}{norm}.{kind}" for norm in ("norm1", "norm2")
                          if present(f"{block}{norm}.{kind}")})
        names.update({f"merger.fc1.{kind}": f"merger.mlp.0.{kind}", f"merger.fc2.{kind}": f"merger.mlp.2.{kind}"})
        if present(f"merger.ln_q.{kind}"):
            names[f"merger.norm.{kind}"] = f"merger.ln_q.{kind}"
    return names


QKV = ("q_proj", "k_proj", "v_proj")


def vision_tensors(tensors: Dict[str, np.ndarray], config: dict) -> Dict[str, np.ndarray]:
    """The tower's tensors under NativeVisionTower's names, float32."""
    settings = vision_settings(config)
    source = _vision_part(tensors)
    out = {"patch_embed.weight": source.pop("patch_embed.proj.weight").reshape(settings["width"], -1)}
    for ours, theirs in _vision_names(settings, source.__contains__).items():
        out[ours] = source.pop(theirs)
    for layer in range(settings["layers"]):
        for kind in ("weight", "bias"):
            fused = source.pop(f"blocks.{layer}.attn.qkv.{kind}")
            out.update({f"blocks.{layer}.attn.{name}.{kind}": part for name, part in zip(QKV, np.split(fused, 3))})
    if source:
        raise ConversionError(f"vision tower: {len(source)} tensors this converter does not know, e.g. "
                              f"{sorted(source)[0]!r}; the checkpoint is of another architecture")
    return {name: np.ascontiguousarray(value, np.float32) for name, value in out.items()}


def hf_vision_tensors(tower: Dict[str, np.ndarray], config: dict, prefix: str) -> Dict[str, np.ndarray]:
    """NativeVisionTower's tensors back under the checkpoint's names (`prefix`: "visual." or "model.visual."): the
    Conv3d patch embedding (out, channels, time, patch, patch), the fused qkv."""
    settings = vision_settings(config)
    vision = config.get("vision_config") or {}
    side, temporal = vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    out = {"patch_embed.proj.weight": tower["patch_embed.weight"].reshape(settings["width"], -1, temporal, side, side)}
    out.update({theirs: tower[ours] for ours, theirs in _vision_names(settings, lambda name: True).items()
                if ours in tower})  # the norms this family has
    for layer in range(settings["layers"]):
        for kind in ("weight", "bias"):
            out[f"blocks.{layer}.attn.qkv.{kind}"] = np.concatenate([tower[f"blocks.{layer}.attn.{name}.{kind}"]
                                                                     for name in QKV])
    return {prefix + name: value for name, value in out.items()}


def language_config(config: dict, path) -> DecoderConfig:
    """The language model's DecoderConfig (Qwen2 with M-RoPE) from a checkpoint's config.json (text_config merged)."""
    from mindvl.pretrained.families import FAMILIES, decoder_config

    family = family_of(config)
    return decoder_config({**config, **config.get("text_config", {}), "model_type": family}, FAMILIES[family], path)


def language_tensors(tensors: Dict[str, np.ndarray], cfg: DecoderConfig, path) -> Dict[str, np.ndarray]:
    """The language model's tensors under CausalLM's names (both key layouts), shapes checked, none left over."""
    from mindvl.pretrained.families import FAMILIES
    from mindvl.pretrained.llm import hf_decoder_tensors

    text = {name.replace("model.language_model.", "model.", 1): value for name, value in tensors.items()
            if not name.startswith(VISION_PREFIXES)}
    return hf_decoder_tensors(text, cfg, FAMILIES["qwen2_5_vl"], path)  # both families name it alike


LANGUAGE_PREFIXES = ("model.", "model.language_model.")  # before 4.52 (and 5.x's save), 4.52-4.5x


def hf_language_tensors(decoder: Dict[str, np.ndarray], cfg: DecoderConfig, prefix: str) -> Dict[str, np.ndarray]:
    """CausalLM's tensors back under the checkpoint's names, the blocks under `prefix` (LANGUAGE_PREFIXES)."""
    from mindvl.pretrained.families import BLOCK_NAMES, hf_names

    return {theirs.replace("model.", prefix, 1): decoder[ours]
            for ours, theirs in hf_names(cfg.layers, BLOCK_NAMES).items() if ours in decoder}


def key_layout(tensors) -> Tuple[str, str]:
    """(the tower's prefix, the language model's) a checkpoint's names use."""
    vision = next(p for p in VISION_PREFIXES if any(name.startswith(p) for name in tensors))
    language = LANGUAGE_PREFIXES[any(name.startswith("model.language_model.") for name in tensors)]
    return vision, language


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
SYSTEM_OPEN, TURN_END = "<|im_start|>system\n", "<|im_end|>\n"


def _jinja_template(folder: Path) -> Tuple[Optional[str], Optional[Path]]:
    """The checkpoint's chat template (Jinja) and the file it is in: chat_template.jinja (transformers >= 4.52),
    chat_template.json (the processor's) or tokenizer_config.json's "chat_template" (a string, or named
    templates: "default")."""
    for name in TEMPLATE_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".jinja"):
            return path.read_text(), path
        template = json.loads(path.read_text()).get("chat_template")
        if isinstance(template, list):
            template = {entry.get("name"): entry.get("template") for entry in template}.get("default")
        if template:
            return template, path
    return None, None


def _probes():
    """Conversations that exercise every part of a template (the messages transformers' processors take, and
    the same as mindvl turns): an image and text; then a system turn, a video, an answer and two images."""
    from mindvl.chat import IMAGE_SLOT, VIDEO_SLOT, Turn

    image, video = {"type": "image"}, {"type": "video"}
    first = ([{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}],
             [Turn("user", (IMAGE_SLOT, "What is it?"))], (1, 0))
    second = ([{"role": "system", "content": "Be brief."},
               {"role": "user", "content": [video, {"type": "text", "text": "And this?"}]},
               {"role": "assistant", "content": "A cat."},
               {"role": "user", "content": [image, image, {"type": "text", "text": "Which is red?"}]}],
              [Turn("system", ("Be brief.",)), Turn("user", (VIDEO_SLOT, "And this?")), Turn("assistant", ("A cat.",)),
               Turn("user", (IMAGE_SLOT, IMAGE_SLOT, "Which is red?"))], (2, 1))
    return first, second


def checkpoint_template(folder: Path, tokenizer) -> Tuple[Optional[str], str]:
    """(the default system text of the checkpoint's chat template, None when it adds no system turn; a line
    saying where it came from). The template is rendered by Jinja (as transformers renders it, sandboxed) on
    probe conversations and must give the ids mindvl's "qwen" template gives; ConversionError showing where
    they part otherwise. A folder with no template gets the family's turns without a system turn."""
    import dataclasses

    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from mindvl.chat import ChatEncoder, chat_template

    source, path = _jinja_template(Path(folder))
    if source is None:
        return None, "no chat template in the folder: the family's turns, no system turn"
    try:
        jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    except TemplateError as exc:
        raise ConversionError(f"{path}: the chat template does not render ({exc})") from exc

    def render(messages) -> str:
        try:
            return jinja.render(messages=messages, add_generation_prompt=True, add_vision_id=False)
        except TemplateError as exc:
            raise ConversionError(f"{path}: the chat template does not render ({exc})") from exc

    default = render([{"role": "user", "content": "x"}])
    system = None
    if default.startswith(SYSTEM_OPEN) and TURN_END in default:
        system = default[len(SYSTEM_OPEN):default.index(TURN_END)]
    chat = ChatEncoder(tokenizer, dataclasses.replace(chat_template("qwen"), default_system=system), 0, 0)
    for messages, turns, (images, videos) in _probes():
        theirs = tokenizer.encode(render(messages), add_special_tokens=False).ids
        ours = chat.prompt(turns, images=images, videos=videos, sizes=[1] * (images + videos)).ids.tolist()
        if theirs != ours:
            at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
            raise ConversionError(
                f"{path}: its chat template renders {tokenizer.decode(theirs[at:at + 12], skip_special_tokens=False)!r} "
                f"where the family's renders {tokenizer.decode(ours[at:at + 12], skip_special_tokens=False)!r} (token "
                f"{at}); mindvl prompts with the family's ChatML turns only, so a changed template would be trained "
                f"and served differently from what the checkpoint expects")
    return system, f"chat template of {path.name}" + (f", default system turn {system!r}" if system else "")
