"""The fused decode step (cells/kernels/decoder_step.cc, FusedDecodeStep): a decoder block's one-token step, and its
prefill, in one kernel give the block's own cells' logits, new cache rows and caches, for Gemma-, Llama- and Qwen2-like blocks (q/k norms,
sandwich norms, sliding windows, grouped queries, one kv head, biases, GELU-tanh and SiLU) with float32, int8 and
int4 weights, on the native build and the AVX2 one; blocks it cannot run keep their cells, by name; exports put the
cells back."""
from dataclasses import replace

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindvl.cells.decoder import CausalLM, Decode, Prefill
from mindvl.cells.kernels import ARCH_ENV, standard_kernels, use_kernels
from mindvl.cells.kernels.cpu import FusedDecodeStep, FusedInt4MatMul, FusedInt8MatMul, decode_step_problems
from mindvl.cells.quantize import quantize_model
from mindvl.config import DecoderConfig

from tests.cells.test_kernels import BUILDS, _built

ms.set_context(mode=ms.GRAPH_MODE)
GEMMA_LIKE = DecoderConfig(width=32, layers=3, heads=4, kv_heads=2, mlp_ratio=2.0, vocab_size=50, qk_norm=True,
                           sandwich_norm=True, sliding_window=3, layer_types=["local", "global", "local"],
                           local_rope_theta=100.0, embed_scale=2.0, activation="gelu_tanh")
LLAMA_LIKE = replace(GEMMA_LIKE, kv_heads=1, qk_norm=False, sandwich_norm=False, sliding_window=0, layer_types=[],
                     activation="silu")
QWEN2_LIKE = replace(LLAMA_LIKE, kv_heads=4, attention_bias=True)
CACHE = 16


def _decode(lm, step, caches):
    logits, keys, values = Decode(lm)(*step, *caches)
    rows = [c.asnumpy() if c.shape[1] == 1 else c.asnumpy()[:, 5:6] for c in (*keys, *values)]
    return [logits.asnumpy(), *rows]


def _decode_three_ways(cfg, weights, arch, monkeypatch):
    """The logits and new key/value rows of one decode step of 3 rows after a 5-token prefill, then the prefill's
    logits and caches (a padded row's padding included): by the block's cells with the weights widened to float32,
    with the fused quantized products, and by the fused steps."""
    monkeypatch.setenv(ARCH_ENV, arch)
    _built(arch)
    rng = np.random.default_rng(7)
    lm = CausalLM(cfg, cache_len=CACHE)
    lm.set_train(False)
    for name, param in lm.parameters_and_names():  # non-zero biases, so both paths add them
        if name.endswith("bias"):
            param.set_data(Tensor(rng.standard_normal(param.shape).astype(np.float32) * 0.5))
    if weights != "float32":
        quantize_model(lm, weights)
    ids = rng.integers(0, 50, (3, 6)).astype(np.int32)
    valid = np.ones((3, 5), bool)
    valid[1, :2] = False  # a left-padded row
    logits, cache_k, cache_v = Prefill(lm)(Tensor(ids[:, :5]), Tensor(valid))
    prefill = [logits.asnumpy(), *(c.asnumpy() for c in (*cache_k, *cache_v))]
    slot_valid = np.zeros((3, CACHE), bool)
    slot_valid[:, :6] = True
    slot_valid[1, :2] = False
    step = [Tensor(ids[:, 5:6]), Tensor(np.array([[5], [3], [5]], np.int32)), Tensor(np.full((3, 1), 5, np.int32)),
            Tensor(slot_valid)]
    widened = _decode(lm, step, [*cache_k, *cache_v])
    use_kernels(lm, "fused", only=(FusedInt8MatMul, FusedInt4MatMul))
    products = _decode(lm, step, [*cache_k, *cache_v])
    products_prefill = [t.asnumpy() for t in _flat(Prefill(lm)(Tensor(ids[:, :5]), Tensor(valid)))]
    assert use_kernels(lm, "fused", only=(FusedDecodeStep,)) == cfg.layers and lm.fused_steps()
    fused_prefill = [t.asnumpy() for t in _flat(Prefill(lm)(Tensor(ids[:, :5]), Tensor(valid)))]
    stale = [c.asnumpy().copy() for c in (*cache_k, *cache_v)]
    for cache in stale:
        cache[:, 5] = rng.standard_normal(cache[:, 5].shape)  # what the step's own slot held: never read
    fused = _decode(lm, step, [Tensor(c) for c in stale])
    return widened + prefill, products + products_prefill, fused + fused_prefill


def _flat(outputs):
    logits, keys, values = outputs
    return [logits, *keys, *values]


@pytest.mark.parametrize("cfg, weights, arch", [
    (GEMMA_LIKE, "float32", "native"), (GEMMA_LIKE, "int8", "native"), (GEMMA_LIKE, "int4", "native"),
    (LLAMA_LIKE, "int4", "native"), (QWEN2_LIKE, "float32", "native"),
    pytest.param(GEMMA_LIKE, "int4", BUILDS[1].values[0], marks=BUILDS[1].marks),
], ids=["gemma-float32", "gemma-int8", "gemma-int4", "llama-one-kv-head-int4", "qwen2-biases-float32",
        "gemma-int4-avx2"])
def test_the_fused_steps_and_prefill_give_the_block_cells_numbers(cfg, weights, arch, monkeypatch):
    """Float32: rounding apart. Quantized: the kernels quantize each product's input rows to int8 (products.h), so
    they differ from the widened weights' float32 products by that rounding, which the q/k norms amplify (~7e-3 on
    Gemma-like int4 blocks); the fused step must be as close to the widened numbers as the quantized product
    kernels are (a weight layout read wrong would differ by the outputs' size, ~0.3)."""
    widened, products, fused = _decode_three_ways(cfg, weights, arch, monkeypatch)
    assert fused[1].shape == (3, 1, (cfg.kv_heads or cfg.heads) * (cfg.width // cfg.heads))
    assert fused[-1].shape == (3, CACHE, (cfg.kv_heads or cfg.heads) * (cfg.width // cfg.heads))
    for exact, by_kernels, step in zip(widened, products, fused):
        assert step.shape == exact.shape
        if weights == "float32":
            np.testing.assert_allclose(step, exact, rtol=1e-5, atol=1e-5)
        else:
            assert np.abs(step - exact).max() <= 2 * np.abs(by_kernels - exact).max() + 1e-5


def test_blocks_it_cannot_run_keep_their_cells():
    for changes, problem in [({"lora_rank": 2}, "without LoRA"), ({"gated_mlp": False, "mlp_bias": True},
                                                                  "an MLP other than gated"),
                             ({"activation": "gelu"}, "gated GELU-tanh or SiLU")]:
        lm = CausalLM(replace(LLAMA_LIKE, **changes), cache_len=CACHE)
        assert any(problem in p for p in decode_step_problems(lm.blocks[0]))
        with pytest.raises(ValueError, match=f"fused decode step: the block has .*{problem}"):
            FusedDecodeStep(lm.blocks[0], _built("native"))
        use_kernels(lm, "fused", only=(FusedDecodeStep,))
        assert not lm.fused_steps() and not Decode(lm).beside


def test_training_kernels_leave_the_steps_out():
    """"fused" and "auto" without `only` (a training model's kernels) never swap in the step: it has no backward."""
    lm = CausalLM(GEMMA_LIKE, cache_len=CACHE)
    _built("native")
    assert use_kernels(lm, "fused") > 0 and not lm.fused_steps()


def test_exports_put_the_block_cells_back():
    lm = CausalLM(GEMMA_LIKE, cache_len=CACHE)
    _built("native")
    use_kernels(lm, "fused", only=(FusedDecodeStep,))
    steps = [block.fused_step for block in lm.blocks]
    assert all(isinstance(step, FusedDecodeStep) for step in steps)
    with standard_kernels(lm):
        assert not lm.fused_steps() and not Decode(lm).beside
        assert not any(isinstance(cell, FusedDecodeStep) for _, cell in lm.cells_and_names())
    assert [block.fused_step for block in lm.blocks] == steps
