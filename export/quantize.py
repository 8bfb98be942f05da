"""INT8 weight-only post-training quantization of a model's dense projections, in place.

Every `Linear` (attention, MLP, fusion input projections, heads, patch embedding) becomes an
`Int8Linear`: per-output-channel symmetric int8 weights dequantized in the graph, activations float32.
Everything else stays float32 on purpose: embedding tables (gathered, not multiplied), norms, logit
scales and the audio `Conv1dMatMul` convolutions (few weights, sensitive to error). Quantize a model
for inference or export only: the int8 weights are frozen, and LoRA adapters are folded in and dropped.
"""
from collections import Counter
from typing import Dict

import numpy as np
from mindspore import nn

from mindvl.cells.linear import Linear
from mindvl.cells.quant import Int8Linear


def quantize_int8(model: nn.Cell) -> Dict[str, float]:
    """Replace every Linear inside `model` by its Int8Linear and return what it changed:

    layers: Linear cells replaced; quantized_parameters / total_parameters: int8 weight elements and
    all parameter elements of the quantized model; weight_bytes_float32 / weight_bytes_int8: those
    weights' storage before and after (int8 values + float32 scales); max_relative_error: the largest
    ||W - dequantized W|| / ||W|| (Frobenius) over the layers. Parameter names stay the model's paths
    (`fusion.encoder.blocks.0.attn.q_proj.weight_int8`).
    """
    replaced: Dict[int, Int8Linear] = {}  # id(Linear) -> its copy, so a shared Linear stays shared
    errors = []
    for _, parent in list(model.cells_and_names()):
        for child_name, child in list(parent.name_cells().items()):
            if not isinstance(child, Linear):
                continue
            if id(child) not in replaced:
                replaced[id(child)] = Int8Linear.from_linear(child)
                errors.append(_relative_error(child, replaced[id(child)]))
            if isinstance(parent, nn.CellList):
                parent[int(child_name)] = replaced[id(child)]
            else:
                setattr(parent, child_name, replaced[id(child)])
    _restore_parameter_names(model)
    weights = sum(layer.weight_int8.size for layer in replaced.values())
    scales = sum(layer.weight_scale.size for layer in replaced.values())
    return {
        "layers": len(replaced),
        "quantized_parameters": int(weights),
        "total_parameters": int(sum(param.size for param in model.get_parameters())),
        "weight_bytes_float32": int(4 * weights),
        "weight_bytes_int8": int(weights + 4 * scales),
        "max_relative_error": max(errors, default=0.0),
    }


def _relative_error(linear: Linear, quantized: Int8Linear) -> float:
    weight = linear.merged_state()["weight"]
    restored = quantized.weight_int8.asnumpy().astype(np.float32) * quantized.weight_scale.asnumpy()[:, None]
    norm = np.linalg.norm(weight)
    return float(np.linalg.norm(weight - restored) / norm) if norm > 0 else 0.0


def _restore_parameter_names(model: nn.Cell) -> None:
    """Attaching a cell prefixes its parameter names with the attribute name only; reset every name to
    its full path in `model` so checkpoints and MindIR keep canonical, unique names."""
    names = Counter()
    for path, param in model.parameters_and_names():
        param.name = path
        names[path] += 1
    duplicates = sorted(name for name, count in names.items() if count > 1)
    if duplicates:
        raise RuntimeError(f"quantize_int8: duplicate parameter names after quantizing: {duplicates[:5]}")
