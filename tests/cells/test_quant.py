"""Weight-only quantized layouts (cells/quant.py): int8 per channel and in groups, int4 in groups of 32 with a
minimum, each within half a step of the float weight; the cells' standard products and table rows against
numpy; a decoder's products and token table quantized (cells/quantize.py) from its weights and, built empty from
stored shapes, loaded to the same logits."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindvl.cells.decoder import CausalLM
from mindvl.cells.linear import Linear
from mindvl.cells.quant import (Int4Linear, Int8Linear, QuantizedLinear, dequantize, pack_int4, quantize_int4,
                                quantize_int8, quantized_layer, quantized_tensors, unpack_int4)
from mindvl.cells.quantize import quantize_model
from mindvl.config import DecoderConfig

ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.parametrize("group", [None, 32, 16])
def test_int8_groups_round_each_weight_to_within_half_a_step(group):
    weight = np.random.default_rng(0).normal(size=(12, 64)).astype(np.float32)
    weight[2] = 0.0
    q, scale = quantize_int8(weight, group)
    assert q.dtype == np.int8 and scale.shape == (12, 64 // (group or 64)) and np.abs(q).max() == 127
    restored = dequantize({"weight_int8": q, "weight_scale": scale})
    steps = np.repeat(scale, group or 64, axis=1)
    assert (np.abs(restored - weight) <= steps / 2 + 1e-7).all() and not restored[2].any()


def test_int4_groups_hold_their_extremes_and_round_the_rest_within_half_a_step():
    weight = np.random.default_rng(1).normal(size=(5, 96)).astype(np.float32)
    weight[1, :32] = 0.25  # a constant group: scale 1, every value at the minimum exactly
    packed, scale, minimum = quantize_int4(weight, refinements=0)  # the min-max grid
    assert packed.dtype == np.uint8 and packed.shape == (5, 48) and scale.shape == minimum.shape == (5, 3)
    restored = dequantize({"weight_int4": packed, "weight_scale": scale, "weight_min": minimum})
    steps = np.repeat(scale, 32, axis=1)
    assert (np.abs(restored - weight) <= steps / 2 + 1e-6).all()
    np.testing.assert_allclose(restored.reshape(5, 3, 32).min(axis=2), weight.reshape(5, 3, 32).min(axis=2), atol=1e-6)
    np.testing.assert_allclose(restored.reshape(5, 3, 32).max(axis=2), weight.reshape(5, 3, 32).max(axis=2), atol=1e-5)
    np.testing.assert_array_equal(restored[1, :32], 0.25)


def test_refining_the_int4_grid_lowers_the_rounding_error():
    weight = np.random.default_rng(4).standard_t(5, size=(64, 256)).astype(np.float32)  # heavier tails than normal

    def error(refinements):
        stored = dict(zip(("weight_int4", "weight_scale", "weight_min"), quantize_int4(weight, refinements)))
        return np.linalg.norm(dequantize(stored) - weight)

    assert error(4) < 0.95 * error(0)
    constant = np.full((2, 32), 0.5, np.float32)
    restored = dequantize(dict(zip(("weight_int4", "weight_scale", "weight_min"), quantize_int4(constant))))
    np.testing.assert_array_equal(restored, constant)  # a group with one value keeps it exactly


def test_int4_packing_puts_input_b_and_b_plus_16_of_a_group_in_one_byte():
    q = np.arange(64, dtype=np.uint8).reshape(1, 64) % 16
    packed = pack_int4(q)
    assert packed[0, 0] == q[0, 0] | (q[0, 16] << 4) and packed[0, 16] == q[0, 32] | (q[0, 48] << 4)
    np.testing.assert_array_equal(unpack_int4(packed), q)


def test_int4_falls_back_to_per_channel_int8_for_rows_not_in_groups_of_32():
    assert set(quantized_tensors(np.ones((3, 48), np.float32), "int4")) == {"weight_int8", "weight_scale"}
    assert isinstance(quantized_layer(np.ones((3, 48), np.float32), "int4"), Int8Linear)
    with pytest.raises(ValueError, match="groups of 32"):
        Int4Linear(48, 3)


class Rows(nn.Cell):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def construct(self, ids):
        return self.layer.rows(ids)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_linear_multiplies_and_looks_up_its_widened_rows(kind):
    rng = np.random.default_rng(2)
    weight, bias = rng.normal(size=(40, 64)).astype(np.float32), rng.normal(size=40).astype(np.float32)
    layer = quantized_layer(weight, kind, bias)
    assert isinstance(layer, {"int8": Int8Linear, "int4": Int4Linear}[kind])
    widened = layer.dequantized_weight()
    x = rng.normal(size=(2, 3, 64)).astype(np.float32)
    np.testing.assert_allclose(layer(Tensor(x)).asnumpy(), x @ widened.T + bias, rtol=1e-5, atol=1e-5)
    ids = np.array([[0, 39], [7, 7]], np.int32)
    np.testing.assert_array_equal(Rows(layer)(Tensor(ids)).asnumpy(), widened[ids])


TINY = DecoderConfig(width=64, layers=2, heads=4, kv_heads=2, mlp_ratio=2.0, vocab_size=96, qk_norm=True,
                     sandwich_norm=True, activation="gelu_tanh")


def _decoder(cfg=TINY):
    lm = CausalLM(cfg, cache_len=16)
    lm.set_train(False)
    return lm


@pytest.mark.parametrize("kind, tied", [("int8", True), ("int4", False)])
def test_a_decoder_quantizes_its_products_and_token_table_and_loads_them_back_from_stored_shapes(kind, tied):
    from dataclasses import replace

    ms.set_context(mode=ms.GRAPH_MODE)  # another module of this worker may have left PyNative set
    cfg = replace(TINY, tie_embeddings=tied)
    reference, lm, widened = _decoder(cfg), _decoder(cfg), _decoder(cfg)
    for (_, param), (_, same), (_, again) in zip(reference.parameters_and_names(), lm.parameters_and_names(),
                                                 widened.parameters_and_names()):
        same.set_data(param.data)
        again.set_data(param.data)
    ids = Tensor(np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 7)).astype(np.int32))
    valid = Tensor(np.ones((2, 7), bool))
    float_logits = reference(ids, valid).asnumpy()
    with pytest.raises(RuntimeError, match="before its first call"):  # its compiled graph would stay float
        quantize_model(reference, kind)
    report = quantize_model(lm, kind)
    layers = {name: cell for name, cell in lm.cells_and_names() if isinstance(cell, QuantizedLinear)}
    assert "embed" in layers and ("lm_head" in layers) != tied and lm.quantized_table
    assert report["layers"] == len(layers) == 2 * 7 + (1 if tied else 2)
    assert not any(isinstance(cell, Linear) for _, cell in lm.cells_and_names())
    assert report["weight_bytes_quantized"] < (0.3 if kind == "int8" else 0.25) * report["weight_bytes_float32"]
    int8_layers = {name for name, cell in layers.items() if isinstance(cell, Int8Linear)}
    if kind == "int4":  # the table, the MLP's down and the attention's value projections stay int8
        assert int8_layers == {"embed", "lm_head", "blocks.0.mlp.fc2", "blocks.1.mlp.fc2", "blocks.0.attn.v_proj",
                               "blocks.1.attn.v_proj"}
    else:
        assert int8_layers == set(layers)
    logits = lm(ids, valid).asnumpy()
    # the graph multiplies by exactly the widened weights: the float decoder holding them gives the same logits
    float_params = dict(widened.parameters_and_names())
    for path, layer in layers.items():
        float_params[f"{path}.weight"].set_data(Tensor(layer.dequantized_weight()))
    np.testing.assert_allclose(logits, widened(ids, valid).asnumpy(), rtol=1e-4, atol=1e-5)
    error = np.linalg.norm(logits - float_logits) / np.linalg.norm(float_logits)
    assert 0 < error < (0.05 if kind == "int8" else 0.5)  # random N(0, 0.02) weights: no structure for int4 to keep

    stored = {name: param.asnumpy() for name, param in lm.parameters_and_names()}
    with nn.utils.no_init_parameters():  # as a quantized folder loads: nothing float32 built for the products
        empty = _decoder(cfg)
        quantize_model(empty, stored={name: value.shape for name, value in stored.items()})
    assert {name for name, _ in empty.parameters_and_names()} == set(stored)
    for name, param in empty.parameters_and_names():
        param.set_data(Tensor(stored[name]))
    np.testing.assert_array_equal(empty(ids, valid).asnumpy(), logits)


def test_unknown_weights_are_refused_by_name():
    with pytest.raises(ValueError, match="int3"):
        quantize_model(_decoder(), "int3")
