"""A GGUF's quantized blocks in mindvl's int8 / int4 layouts (mindvl/pretrained/gguf_blocks.py): every widened value
equal to the gguf package's own dequantization, for blocks the gguf package writes (Q8_0, Q5_0, Q4_0) and for the
K-quant tensors of the registry's Gemma 3 GGUF (Q4_K, Q6_K), which it only reads."""
import gguf
import numpy as np
import pytest

from mindvl.cells.quant import dequantize
from mindvl.pretrained.gguf_blocks import gguf_layout

KINDS = gguf.GGMLQuantizationType


@pytest.mark.parametrize("kind, stored", [("Q8_0", "weight_int8"), ("Q5_0", "weight_int8"), ("Q4_0", "weight_int4")])
def test_written_blocks_widen_to_the_gguf_values(kind, stored):
    weight = np.random.default_rng(0).normal(size=(6, 128)).astype(np.float32)
    weight[1, :32] = 0.0  # an all-zero block: d = 0
    data = gguf.quants.quantize(weight, KINDS[kind])
    layout = gguf_layout(data, KINDS[kind])
    assert stored in layout and layout["weight_scale"].shape == (6, 4)
    np.testing.assert_array_equal(dequantize(layout), gguf.quants.dequantize(data, KINDS[kind]))


@pytest.fixture(scope="module")
def gemma_gguf():
    from mindvl.pretrained.llm import _gguf_reader, installed_gguf

    return _gguf_reader(installed_gguf())


@pytest.mark.parametrize("kind, stored, group", [("Q4_K", "weight_int4", 32), ("Q6_K", "weight_int8", 16),
                                                 ("Q8_0", "weight_int8", 32), ("Q5_0", "weight_int8", 32)])
def test_the_gemma_gguf_k_quants_widen_to_the_gguf_values(gemma_gguf, kind, stored, group):
    tensor = next(t for t in gemma_gguf.tensors if t.tensor_type == KINDS[kind] and t.name.startswith("blk."))
    layout = gguf_layout(tensor.data, tensor.tensor_type)
    rows, width = tensor.data.shape[0], int(tensor.shape[0])
    assert layout["weight_scale"].shape == (rows, width // group)
    assert layout[stored].shape == (rows, width if stored == "weight_int8" else width // 2)
    want = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, width)
    np.testing.assert_array_equal(dequantize(layout), want)


def test_another_quantization_is_left_to_the_caller():
    data = gguf.quants.quantize(np.ones((2, 64), np.float32), KINDS.Q4_1)
    assert gguf_layout(data, KINDS.Q4_1) is None
