"""Hugging Face Qwen2-VL and Qwen2.5-VL checkpoints as mindvl's cells: the vision tower's settings and tensors
(cells.native_vision.NativeVisionTower), the language model's DecoderConfig (Qwen2 with M-RoPE: the family entries
in mindvl.pretrained.families) and tensors (cells.decoder.CausalLM), and the chat's special tokens.

transformers saves the tower's keys as `visual.*` (before 4.52, and 5.x's save_pretrained) or `model.visual.*`
(4.52-4.5x), the language model's `model.layers.*` or `model.language_model.layers.*`: both are read. The Conv3d patch embedding (out, 3, 2, 14, 14) is the MatMul's (out, 1176) weight
flattened in the processor's patch order (channel, time, row, column); the fused qkv projection is split into
q, k and v.
"""
from typing import Dict

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


def vision_tensors(tensors: Dict[str, np.ndarray], config: dict) -> Dict[str, np.ndarray]:
    """The tower's tensors under NativeVisionTower's names, float32."""
    settings = vision_settings(config)
    source = _vision_part(tensors)
    out = {"patch_embed.weight": source.pop("patch_embed.proj.weight").reshape(settings["width"], -1)}
    mlp = ({"gate_proj": "gate", "up_proj": "fc1", "down_proj": "fc2"} if settings["family"] == "qwen2_5_vl"
           else {"fc1": "fc1", "fc2": "fc2"})
    for layer in range(settings["layers"]):
        theirs, ours = f"blocks.{layer}.", f"blocks.{layer}."
        for kind in ("weight", "bias"):
            qkv = source.pop(f"{theirs}attn.qkv.{kind}")
            for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(qkv, 3)):
                out[f"{ours}attn.{name}.{kind}"] = part
            out[f"{ours}attn.out_proj.{kind}"] = source.pop(f"{theirs}attn.proj.{kind}")
            for their_name, our_name in mlp.items():
                out[f"{ours}mlp.{our_name}.{kind}"] = source.pop(f"{theirs}mlp.{their_name}.{kind}")
            for norm in ("norm1", "norm2"):
                if f"{theirs}{norm}.{kind}" in source:
                    out[f"{ours}{norm}.{kind}"] = source.pop(f"{theirs}{norm}.{kind}")
    for kind in ("weight", "bias"):
        if f"merger.ln_q.{kind}" in source:
            out[f"merger.norm.{kind}"] = source.pop(f"merger.ln_q.{kind}")
        out[f"merger.fc1.{kind}"] = source.pop(f"merger.mlp.0.{kind}")
        out[f"merger.fc2.{kind}"] = source.pop(f"merger.mlp.2.{kind}")
    if source:
        raise ConversionError(f"vision tower: {len(source)} tensors this converter does not know, e.g. "
                              f"{sorted(source)[0]!r}; the checkpoint is of another architecture")
    return {name: np.ascontiguousarray(value, np.float32) for name, value in out.items()}


SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def language_config(config: dict, path) -> DecoderConfig:
    """The language model's DecoderConfig (Qwen2 with M-RoPE) from a checkpoint's config.json (text_config merged)."""
    from mindvl.pretrained.families import FAMILIES, decoder_config

    family = family_of(config)
    return decoder_config({**config, **config.get("text_config", {}), "model_type": family}, FAMILIES[family], path)


def language_tensors(tensors: Dict[str, np.ndarray], layers: int) -> Dict[str, np.ndarray]:
    """The language model's tensors under CausalLM's names (both key layouts)."""
    from mindvl.pretrained.families import BLOCK_NAMES, hf_names

    text = {name.replace("model.language_model.", "model.", 1): value for name, value in tensors.items()
            if not name.startswith(VISION_PREFIXES)}
    return {ours: np.ascontiguousarray(text[theirs], np.float32)
            for ours, theirs in hf_names(layers, BLOCK_NAMES).items() if theirs in text}
