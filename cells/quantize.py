"""Weight-only post-training quantization of a model's dense projections, in place (cells/quant.py's layouts).

Every `Linear` (attention, MLP, fusion input projections, heads, patch embedding) becomes an Int8Linear or an
Int4Linear, and a decoder's token table (its embedding, tied to its LM head, and an untied head) a quantized
table: at Gemma 3 270M the table is 63% of the weights and the head the largest product of a decode step. The
int4 layout keeps the table and the MLP's down and attention's value projections at int8 (quant.INT8_TABLES, INT8_PROJECTIONS).
Everything else stays float32 on purpose: norms, logit scales, position tables and the audio `Conv1dMatMul`
convolutions (few weights, sensitive to error). Quantize a model for inference or export only: the quantized
weights are frozen, and LoRA adapters are folded in and dropped.

Two sources: a float model's own weights (`weights` "int8": per channel; "int4": groups of 32, per-channel
int8 for a layer whose inputs are not in groups of 32), or the shapes of stored quantized tensors (`stored`,
a converted folder's or a GGUF's), which give empty layers of the stored layouts for loading to fill: the
float weights are never built (under no_init_parameters) and the model is never held in float32.
"""
from collections import Counter
from typing import Dict, Optional, Tuple

import numpy as np
from mindspore import nn

from .decoder import CausalLM
from .linear import Linear
from .quant import WEIGHT_CELLS, QuantizedLinear, layer_weights, quantized_layer, stored_cell


def quantize_model(model: nn.Cell, weights: str = "int8",
                   stored: Optional[Dict[str, Tuple[int, ...]]] = None) -> Dict[str, float]:
    """Replace every Linear inside `model` (and a CausalLM's token tables) by its quantized layer and return
    what changed: layers replaced; quantized_parameters / total_parameters: weight elements quantized and all
    parameter elements of the quantized model; weight_bytes_float32 / weight_bytes_quantized: those weights'
    storage before and after (values + float32 scales); max_relative_error: the largest ||W - widened W|| / ||W||
    (Frobenius) over the layers (0 for `stored`). `stored`: {parameter name: shape} of a quantized file; a layer
    it holds no quantized tensors for stays float32. Parameter names stay the model's paths
    (`blocks.0.attn.q_proj.weight_int8`)."""
    if weights not in WEIGHT_CELLS:
        raise ValueError(f"quantize: weights {weights!r} is not one of {sorted(WEIGHT_CELLS)}")
    if model.compile_cache:  # MindSpore would keep running the graph it compiled, float weights and all
        raise RuntimeError(f"quantize: {type(model).__name__} has run as a graph already, which would go on running "
                           f"unquantized; quantize a model before its first call")
    replaced: Dict[int, QuantizedLinear] = {}  # id(Linear) -> its copy, so a shared Linear stays shared
    errors, source_elements = [], 0

    def quantized(path: str, weight_of, has_bias: bool, bias_of=lambda: None) -> Optional[QuantizedLinear]:
        nonlocal source_elements
        if stored is not None:
            layer = stored_cell(_stored_under(stored, path), has_bias)
            if layer is not None:
                source_elements += layer.in_width * layer.out_width
            return layer
        weight = weight_of()
        layer = quantized_layer(weight, layer_weights(path, weights), bias_of())
        source_elements += weight.size
        errors.append(_relative_error(weight, layer))
        return layer

    for parent_path, parent in list(model.cells_and_names()):
        prefix = f"{parent_path}." if parent_path else ""
        if isinstance(parent, CausalLM) and not parent.quantized_table:
            tables = {name: quantized(prefix + name, getattr(parent, name).weight.asnumpy, False)
                      for name in (("embed",) if parent.tied else ("embed", "lm_head"))}
            if all(tables.values()):
                parent.use_quantized_tables(**tables)
        for child_name, child in list(parent.name_cells().items()):
            if not isinstance(child, Linear):
                continue
            if id(child) not in replaced:
                state = None if stored is not None else child.merged_state()
                layer = quantized(prefix + child_name, lambda: state["weight"], child.has_bias,
                                  lambda: state.get("bias"))
                if layer is None:
                    continue
                replaced[id(child)] = layer
            if isinstance(parent, nn.CellList):
                parent[int(child_name)] = replaced[id(child)]
            else:
                setattr(parent, child_name, replaced[id(child)])
    _restore_parameter_names(model)
    layers = [cell for _, cell in model.cells_and_names() if isinstance(cell, QuantizedLinear)]
    stored_bytes = sum(getattr(layer, name).size * getattr(layer, name).itemsize
                       for layer in layers for name in layer.STORED)
    return {
        "layers": len(layers),
        "quantized_parameters": int(source_elements),
        "total_parameters": int(sum(param.size for param in model.get_parameters())),
        "weight_bytes_float32": int(4 * source_elements),
        "weight_bytes_quantized": int(stored_bytes),
        "max_relative_error": max(errors, default=0.0),
    }


def _stored_under(stored: Dict[str, Tuple[int, ...]], path: str) -> Dict[str, Tuple[int, ...]]:
    """{"weight_int8": shape, ...}: the stored tensors of the layer at `path`."""
    return {name[len(path) + 1:]: tuple(shape) for name, shape in stored.items()
            if name.startswith(path + ".") and "." not in name[len(path) + 1:]}


def _relative_error(weight: np.ndarray, quantized: QuantizedLinear) -> float:
    norm = np.linalg.norm(weight)
    return float(np.linalg.norm(weight - quantized.dequantized_weight()) / norm) if norm > 0 else 0.0


def _restore_parameter_names(model: nn.Cell) -> None:
    """Attaching a cell prefixes its parameter names with the attribute name only; reset every name to
    its full path in `model` so checkpoints and MindIR keep canonical, unique names."""
    names = Counter()
    for path, param in model.parameters_and_names():
        param.name = path
        names[path] += 1
    duplicates = sorted(name for name, count in names.items() if count > 1)
    if duplicates:
        raise RuntimeError(f"quantize: duplicate parameter names after quantizing: {duplicates[:5]}")
