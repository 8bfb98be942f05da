"""The decoder families a Hugging Face folder may hold (`mindvl convert llm --hf`), each as data.

A family is a configuration of the one block family (cells.transformer, cells.decoder), never a copy of it:
`settings` maps its config.json onto DecoderConfig's fields beyond those every family shares (`shared`),
`block_names` maps each block tensor of cells.decoder.CausalLM to the family's name under
`model.layers.<N>.`, and `norm_offset` is what its norm weights need on the way in. Adding a family is an
entry in FAMILIES plus a parity test against its reference (tests/references/ref_tiny_llms.py makes a tiny
random checkpoint with transformers; tests/pretrained/test_llm.py compares logits and greedy tokens):
docs/architecture.md walks through it.
"""
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict

from mindvl.config import DecoderConfig
from mindvl.errors import ConversionError

# CausalLM's block tensors -> a Llama-style checkpoint's (Llama, Qwen2 and Gemma 3 share these)
BLOCK_NAMES = {
    "norm1.weight": "input_layernorm.weight", "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight", "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.out_proj.weight": "self_attn.o_proj.weight", "attn.q_proj.bias": "self_attn.q_proj.bias",
    "attn.k_proj.bias": "self_attn.k_proj.bias", "attn.v_proj.bias": "self_attn.v_proj.bias",
    "attn.out_proj.bias": "self_attn.o_proj.bias", "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight", "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.fc1.weight": "mlp.up_proj.weight", "mlp.fc2.weight": "mlp.down_proj.weight",
    "mlp.gate.bias": "mlp.gate_proj.bias", "mlp.fc1.bias": "mlp.up_proj.bias", "mlp.fc2.bias": "mlp.down_proj.bias",
    # Llama and Qwen2 call the norm before the MLP "post_attention"; Gemma's sandwich has one of each
    "norm2.weight": "post_attention_layernorm.weight",
}
SANDWICH_NAMES = {"post_attn_norm.weight": "post_attention_layernorm.weight",
                  "norm2.weight": "pre_feedforward_layernorm.weight",
                  "post_mlp_norm.weight": "post_feedforward_layernorm.weight"}
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}  # transformers' -> ours


def rope_theta(hf: Dict, key: str = "rope_theta", default: float = 10000.0) -> float:
    """rope_theta from a transformers 4 (top level) or 5 (rope_parameters) config; scaled ropes refused."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5 Gemma 3: one entry per attention kind
        params = params["full_attention" if key == "rope_theta" else "sliding_attention"]
    scaling = hf.get("rope_scaling") or params
    if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", "mrope", None):
        raise ConversionError(f"rope scaling {scaling.get('rope_type') or scaling.get('type')!r} is not supported "
                              f"(only unscaled rotary embeddings)")
    return float(params.get("rope_theta", hf.get(key, default)))


@dataclass(frozen=True)
class Family:
    """One decoder family: see the module docstring."""

    settings: Callable[[Dict, Dict], Dict]  # (config.json, the shared settings) -> the family's own settings
    block_names: Dict[str, str]
    norm_offset: float = 0.0
    tied_by_default: bool = False  # tie_word_embeddings when config.json leaves it out


def _llama(hf: Dict, shared: Dict) -> Dict:
    bias = bool(hf.get("attention_bias", False))
    return dict(attention_bias=bias, output_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)),
                rope_theta=rope_theta(hf))


def _qwen2(hf: Dict, shared: Dict) -> Dict:
    if hf.get("use_sliding_window"):
        raise ConversionError("Qwen2 with use_sliding_window is not supported")
    return dict(attention_bias=True, rope_theta=rope_theta(hf))


def _qwen2_vl(hf: Dict, shared: Dict) -> Dict:
    """The language model of Qwen2-VL and Qwen2.5-VL: Qwen2 with M-RoPE (rope_scaling.mrope_section)."""
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not scaling.get("mrope_section"):
        raise ConversionError("a Qwen2-VL language model without rope_scaling.mrope_section")
    return dict(_qwen2(hf, shared), mrope_section=[int(s) for s in scaling["mrope_section"]])


def _gemma3(hf: Dict, shared: Dict) -> Dict:
    layer_types = hf.get("layer_types") or ["global" if (i + 1) % int(hf.get("sliding_window_pattern", 6)) == 0
                                            else "sliding_attention" for i in range(shared["layers"])]
    return dict(qk_norm=True, sandwich_norm=True,
                attention_scale=float(hf.get("query_pre_attn_scalar", shared["head_dim"])) ** -0.5,
                rope_theta=rope_theta(hf, "rope_theta", 1e6),
                local_rope_theta=rope_theta(hf, "rope_local_base_freq", 10000.0),
                sliding_window=int(hf.get("sliding_window") or 0),
                layer_types=["local" if kind == "sliding_attention" else "global" for kind in layer_types],
                embed_scale=math.sqrt(shared["width"]))


FAMILIES: Dict[str, Family] = {  # by config.json's model_type
    "llama": Family(_llama, BLOCK_NAMES),
    "qwen2": Family(_qwen2, BLOCK_NAMES),
    "gemma3_text": Family(_gemma3, {**BLOCK_NAMES, **SANDWICH_NAMES}, norm_offset=1.0, tied_by_default=True),
    "qwen2_5_vl": Family(_qwen2_vl, BLOCK_NAMES),  # the language model of these folders (text_config merged in)
    "qwen2_vl": Family(_qwen2_vl, BLOCK_NAMES),
}


def hf_names(layers: int, block_names: Dict[str, str]) -> Dict[str, str]:
    """CausalLM's tensor names -> a Llama-style checkpoint's: the embedding, final norm, LM head and each of
    `layers` blocks' tensors (`block_names`: a family's)."""
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    for index in range(layers):
        names.update({f"blocks.{index}.{ours}": f"model.layers.{index}.{theirs}" for ours, theirs in block_names.items()})
    return names


def hf_family(hf: Dict, path: Path) -> Family:
    """The family of a Hugging Face config.json, or ConversionError naming the supported ones."""
    if hf.get("model_type") not in FAMILIES:
        raise ConversionError(f"{path}: model_type {hf.get('model_type')!r} is not supported (supported: "
                              f"{list(FAMILIES)})")
    return FAMILIES[hf["model_type"]]


def decoder_config(hf: Dict, family: Family, path: Path) -> DecoderConfig:
    """A family's config.json (`path`'s) as DecoderConfig: the settings every family shares, then its own."""
    width, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    activation = hf.get("hidden_act") or hf.get("hidden_activation") or "silu"
    if activation not in ACTIVATIONS:
        raise ConversionError(f"{path}: activation {activation!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    shared = dict(width=width, layers=int(hf["num_hidden_layers"]), heads=heads,
                  head_dim=int(hf.get("head_dim") or width // heads),
                  kv_heads=int(hf.get("num_key_value_heads") or heads), mlp_ratio=int(hf["intermediate_size"]) / width,
                  norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)), vocab_size=int(hf["vocab_size"]),
                  gated_mlp=True, tie_embeddings=bool(hf.get("tie_word_embeddings", family.tied_by_default)),
                  max_positions=int(hf.get("max_position_embeddings", 8192)), activation=ACTIVATIONS[activation])
    try:
        own = family.settings(hf, shared)
    except ConversionError as exc:
        raise ConversionError(f"{path}: {exc}") from exc
    return DecoderConfig(**shared, **own)
