"""Fused CPU kernels (cells/kernels): each against the standard cell it replaces, outputs and gradients,
over odd shapes, every eps the recipes use and every mask layout; swapped into a model and out again for
exports (no Custom op in the MindIR); a training run with them follows one without; no compiler ->
standard operators + a warning; float16 inputs refused by name. The kernel tests run on every build this
CPU can execute: the native one and the AVX2 + FMA one (x86-64-v3), the code an AVX2-only machine runs."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindvl.cells import kernels
from mindvl.cells.activation import GELU, BiasActivation, ScaledMaskedSoftmax
from mindvl.cells.attention import MASK_VALUE, AttentionCore
from mindvl.cells.kernels import library, standard_kernels, use_kernels
from mindvl.cells.kernels.cpu import (FusedAttentionCore, FusedBiasAdd, FusedBiasGELU, FusedGELU, FusedLayerNorm,
                                      FusedMatMul, FusedRMSNorm, FusedRotateHalf, FusedSoftmax)
from mindvl.cells.linear import Linear
from mindvl.cells.norm import LayerNorm, StandardRMSNorm
from mindvl.cells.rotary import RotateHalf

# float32 sums over a row: outputs and input gradients agree to rounding (erf and exp are polynomial
# approximations within 2e-7); the parameter gradients add up every row, so they are compared relative
# to their size
ATOL, PARAM_RTOL = 2e-5, 1e-4


def _runs_avx2() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return {"avx2", "fma", "bmi2"} <= set(flags)


BUILDS = ["native", pytest.param("x86-64-v3", marks=pytest.mark.skipif(not _runs_avx2(), reason="no AVX2 + FMA"))]


def _built(arch: str):
    built = library(arch)
    if built is None:
        pytest.skip(f"no fused kernels here: {kernels._library[arch].get('failed')}")
    return built


@pytest.fixture(scope="module", params=BUILDS)
def path(request):
    """The kernels of one build (each parity test runs on every build)."""
    return _built(request.param)


@pytest.fixture(scope="module")
def native_path():
    return _built("native")


class Loss(nn.Cell):
    """sum(cell(*inputs) * target): its gradient reaches the cell's output as `target`."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, *inputs):
        return (self.cell(*inputs[:-1]) * inputs[-1]).sum()


def _output_and_grads(cell, inputs, target, wrt):
    """cell(*inputs) and the gradients of sum(output * target) with respect to the inputs at `wrt`."""
    tensors = [ms.Tensor(array) if array is not None else None for array in inputs]
    grads = ms.grad(Loss(cell), grad_position=wrt)(*tensors, ms.Tensor(target))
    grads = grads if isinstance(grads, tuple) else (grads,)
    return cell(*tensors).asnumpy(), [g.asnumpy() for g in grads]


# The standard cells' outputs and gradients by test case: the same on every build, so the second build compares
# with what the first computed instead of compiling and running the standard graphs again.
_STANDARD = {}


@pytest.fixture
def case(request):
    """This test's name and parameters but the build: what its standard results are kept under."""
    callspec = getattr(request.node, "callspec", None)
    params = {} if callspec is None else {k: v for k, v in callspec.params.items() if k != "path"}
    return request.node.originalname, repr(sorted(params.items()))


def standard_results(case, compute):
    """compute()'s value, computed at the first build's run of `case` and kept for the others."""
    if case not in _STANDARD:
        _STANDARD[case] = compute()
    return _STANDARD[case]


def assert_matches_standard(standard, fused, inputs, wrt, case, rtol=0.0):
    def compute():
        rng = np.random.default_rng(7)
        target = rng.normal(size=standard(*[ms.Tensor(a) if a is not None else None for a in inputs]).shape)
        target = target.astype(np.float32)
        return (target, *_output_and_grads(standard, inputs, target, wrt))

    target, want, want_grads = standard_results(case, compute)
    got, got_grads = _output_and_grads(fused, inputs, target, wrt)
    np.testing.assert_allclose(got, want, atol=ATOL)
    for got_grad, want_grad in zip(got_grads, want_grads):
        np.testing.assert_allclose(got_grad, want_grad, atol=ATOL, rtol=rtol)


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 257), (1, 1, 3)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-12])
def test_layer_norm_matches_mindspore_forward_and_backward(path, shape, eps, case):
    rng = np.random.default_rng(sum(shape))
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    target = rng.normal(size=shape).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)

    def run(fused_norm):
        norm = LayerNorm(shape[-1], eps)
        norm.weight.set_data(ms.Tensor(weight))
        norm.bias.set_data(ms.Tensor(np.linspace(-1, 1, shape[-1]).astype(np.float32)))
        if fused_norm is not None:
            norm.layer_norm = fused_norm
        step = ms.value_and_grad(Loss(norm), 0, norm.trainable_params())
        _, (dx, (dweight, dbias)) = step(ms.Tensor(x), ms.Tensor(target))
        return norm(ms.Tensor(x)).asnumpy(), dx.asnumpy(), (dweight.asnumpy(), dbias.asnumpy())

    y0, dx0, params0 = standard_results(case, lambda: run(None))
    y1, dx1, params1 = run(FusedLayerNorm(eps, path))
    np.testing.assert_allclose(y1, y0, atol=ATOL)
    np.testing.assert_allclose(dx1, dx0, atol=ATOL)
    for fused_grad, standard_grad in zip(params1, params0):
        np.testing.assert_allclose(fused_grad, standard_grad, atol=ATOL, rtol=PARAM_RTOL)


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 1027), (1, 1, 1)])
def test_bias_add_matches_add_and_its_bias_gradient_the_column_sums(path, shape, case):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    bias = rng.normal(size=shape[-1]).astype(np.float32)
    assert_matches_standard(ms.ops.Add(), FusedBiasAdd(path), [x, bias], (0, 1), case, rtol=PARAM_RTOL)


@pytest.mark.parametrize("m, k, n", [(4, 16, 8), (7, 5, 3), (33, 257, 1027), (1, 1, 1), (2, 300, 1), (1, 64, 1031)])
def test_matmul_matches_mindspore_and_its_gradients_for_input_and_weight(path, m, k, n, case):
    rng = np.random.default_rng(m + k + n)
    x, weight = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    assert_matches_standard(ms.ops.MatMul(transpose_b=True), FusedMatMul(path), [x, weight], (0, 1), case,
                            rtol=PARAM_RTOL)


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 1027), (1, 1, 1)])
def test_gelu_matches_the_erf_formulation(path, shape, case):
    x = (np.random.default_rng(sum(shape)).normal(size=shape) * 4).astype(np.float32)
    assert_matches_standard(GELU(), FusedGELU(path), [x], 0, case)


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 1027), (1, 1, 1)])
def test_bias_gelu_matches_add_then_gelu_and_returns_the_bias_gradient(path, shape, case):
    rng = np.random.default_rng(sum(shape))
    x = (rng.normal(size=shape) * 3).astype(np.float32)
    bias = rng.normal(size=shape[-1]).astype(np.float32)
    assert_matches_standard(BiasActivation("gelu"), FusedBiasGELU(path), [x, bias], (0, 1), case, rtol=PARAM_RTOL)


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 257), (1, 1, 3)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_matches_the_standard_arithmetic(path, shape, eps, case):
    rng = np.random.default_rng(sum(shape))
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    assert_matches_standard(StandardRMSNorm(eps), FusedRMSNorm(eps, path), [x, weight], (0, 1), case,
                            rtol=PARAM_RTOL)


@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 1, 1, 2), (3, 7, 4, 256)])
def test_rotation_matches_rotate_half_and_its_transpose(path, shape, case):
    """cos and sin drawn at random, halves unequal, so the backward is checked as the exact transpose (Rotary's
    halves are equal, where it is the rotation by minus the angle)."""
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    cos, sin = (rng.uniform(-1, 1, size=(*shape[:2], 1, shape[-1])).astype(np.float32) for _ in range(2))
    assert_matches_standard(RotateHalf(shape[-1]), FusedRotateHalf(shape[-1], path), [x, cos, sin], 0, case)


def test_a_rotation_in_another_layout_is_refused_naming_the_fix(path):
    x = ms.Tensor(np.ones((2, 3, 4, 8), np.float32))
    with pytest.raises(ValueError, match="fused rotation: expected x .* set train.kernels=standard"):
        FusedRotateHalf(8, path)(x, ms.Tensor(np.ones((2, 3, 4, 8), np.float32)), ms.Tensor(np.ones((2, 3, 4, 8), np.float32)))


def test_a_decoder_with_the_kernels_gives_the_standard_logits_and_gradients(native_path):
    from mindvl.cells.decoder import CausalLM
    from mindvl.config import DecoderConfig

    cfg = DecoderConfig(width=32, layers=2, heads=4, kv_heads=2, mlp_ratio=2.0, vocab_size=50, qk_norm=True,
                        sandwich_norm=True)
    ms.set_seed(3)
    lm = CausalLM(cfg)
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 50, (2, 9)).astype(np.int32))
    valid = ms.Tensor(np.ones((2, 9), np.int32))

    def run():
        logits = lm(ids, valid)
        grads = ms.grad(Loss(lm), grad_position=None, weights=lm.trainable_params())(ids, valid, ms.ops.ones_like(logits))
        return logits.asnumpy(), [g.asnumpy() for g in grads]

    want, want_grads = run()
    swapped = use_kernels(lm, "fused")
    fused = [type(c).__name__ for _, c in lm.cells_and_names() if isinstance(c, kernels.fused_cells())]
    assert fused.count("FusedRMSNorm") == 2 * (4 + 2) + 1 and fused.count("FusedRotateHalf") == 2  # one per attention, for q and k
    assert swapped == len(fused)
    got, got_grads = run()
    np.testing.assert_allclose(got, want, atol=ATOL)
    for g, w in zip(got_grads, want_grads):  # sums over the whole model: relative to each gradient's size
        np.testing.assert_allclose(g, w, atol=PARAM_RTOL * np.abs(w).max())


MASKS = {  # additive masks as the encoders build them, each broadcast over the scores (2, 3, 5, 7)
    "none": None,
    "padding (B,1,1,K)": (2, 1, 1, 7),
    "prefix-LM (B,1,Q,K)": (2, 1, 5, 7),
    "per head (B,H,Q,K)": (2, 3, 5, 7),
    "shared (Q,K)": (5, 7),
}


@pytest.mark.parametrize("mask_shape", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("scale", [0.125, 1.0])
def test_scaled_masked_softmax_matches_mul_add_softmax(path, mask_shape, scale, case):
    rng = np.random.default_rng(3)
    scores = (rng.normal(size=(2, 3, 5, 7)) * 4).astype(np.float32)
    mask = None
    if mask_shape is not None:
        mask = np.where(rng.random(mask_shape) < 0.3, MASK_VALUE, 0.0).astype(np.float32)
        mask[..., 0] = 0.0  # every row keeps a key
    assert_matches_standard(ScaledMaskedSoftmax(scale), FusedSoftmax(scale, path), [scores, mask], 0, case)


@pytest.mark.parametrize("mask_shape", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("heads, head_dim", [(3, 4), (1, 5), (2, 16)])
def test_attention_core_matches_the_standard_core_with_every_mask(path, mask_shape, heads, head_dim, case):
    rng = np.random.default_rng(heads * head_dim)
    batch, seq = 2, 7
    q, k, v = (rng.normal(size=(batch, seq, heads * head_dim)).astype(np.float32) for _ in range(3))
    mask = None
    if mask_shape is not None:
        shape = tuple(heads if i == len(mask_shape) - 3 and size == 3 else seq if size in (5, 7) else size
                      for i, size in enumerate(mask_shape))  # MASKS' layouts at this test's sizes
        mask = np.where(rng.random(shape) < 0.3, MASK_VALUE, 0.0).astype(np.float32)
        mask[..., 0] = 0.0
    assert_matches_standard(AttentionCore(heads, head_dim), FusedAttentionCore(heads, head_dim, path), [q, k, v, mask],
                            (0, 1, 2), case)


def test_a_core_with_attention_dropout_keeps_it_and_fuses_only_the_softmax(path):
    from mindvl.cells.attention import MultiHeadAttention

    attention = MultiHeadAttention(8, 2, dropout=0.1)
    assert use_kernels(attention, "fused") == 1 + 4 + 4  # the softmax, the projections' products and biases
    assert isinstance(attention.core, AttentionCore) and isinstance(attention.core.softmax, FusedSoftmax)


def test_a_fully_masked_row_is_uniform_as_in_mindspore(path, case):
    scores = np.random.default_rng(4).normal(size=(1, 1, 2, 6)).astype(np.float32)
    mask = np.zeros((1, 1, 1, 6), np.float32) + MASK_VALUE
    assert_matches_standard(ScaledMaskedSoftmax(0.5), FusedSoftmax(0.5, path), [scores, mask], 0, case)


def test_float16_inputs_are_refused_naming_the_kernel(path):
    with pytest.raises(TypeError, match="MindvlGeluForward: inputs must be float32"):
        FusedGELU(path)(ms.Tensor(np.ones((2, 3), np.float16)))


def test_a_model_swaps_in_the_kernels_and_exports_standard_operators(native_path, tmp_path):
    from mindvl.cells import build_cells
    from mindvl.config import load_config
    from mindvl.export.graphs import TensorSpec, export_graph
    from mindvl.mindir import mindir_ops

    cfg = load_config("tiny", ["model.text.vocab_size=40"])
    model = build_cells(cfg.model, cfg.preprocess)
    model.set_train(False)
    encoder = model.text.encoder
    x = ms.Tensor(np.random.default_rng(0).normal(size=(2, 6, cfg.model.text.width)).astype(np.float32))
    before = encoder(x).asnumpy()
    counts = {kind: sum(isinstance(c, kind) for _, c in model.cells_and_names())
              for kind in (LayerNorm, BiasActivation, GELU, AttentionCore)}
    biased = sum(isinstance(c, Linear) and c.has_bias for _, c in model.cells_and_names())
    linears = sum(isinstance(c, Linear) for _, c in model.cells_and_names())
    swapped = use_kernels(model, "fused")
    assert swapped == counts[LayerNorm] + linears + biased + counts[GELU] + counts[AttentionCore]  # every GELU too
    fused = {kind: sum(isinstance(c, kind) for _, c in model.cells_and_names())
             for kind in (FusedLayerNorm, FusedBiasAdd, FusedMatMul, FusedBiasGELU, FusedGELU, FusedAttentionCore,
                          FusedSoftmax)}
    assert fused[FusedBiasAdd] == biased and fused[FusedMatMul] == linears
    assert fused[FusedBiasGELU] == counts[BiasActivation] and fused[FusedGELU] == counts[GELU] - counts[BiasActivation]
    assert fused[FusedLayerNorm] == counts[LayerNorm] and fused[FusedAttentionCore] == counts[AttentionCore] > 0
    assert fused[FusedSoftmax] == 0  # the cores without dropout are fused whole
    np.testing.assert_allclose(encoder(x).asnumpy(), before, atol=ATOL)
    exported = export_graph(encoder, "text_stack", [TensorSpec("x", "float32", (2, 6, cfg.model.text.width))],
                            tmp_path / "text_stack.mindir")
    ops_used = mindir_ops(exported.read_bytes())
    assert "Custom" not in ops_used and {"LayerNorm", "Erf", "Softmax"} <= set(ops_used)
    assert isinstance(encoder.blocks[0].norm1.layer_norm, FusedLayerNorm)  # the training model keeps them
    with standard_kernels(model):
        assert not isinstance(encoder.blocks[0].norm1.layer_norm, FusedLayerNorm)
        assert isinstance(encoder.blocks[0].mlp.act, BiasActivation)
        np.testing.assert_allclose(encoder(x).asnumpy(), before, atol=ATOL)
    assert use_kernels(model, "standard") == 0
    with pytest.raises(ValueError, match=r"train.kernels: expected one of \['auto', 'standard', 'fused'\], got 'turbo'"):
        use_kernels(model, "turbo")


def test_without_a_compiler_the_standard_operators_stay_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "_library", {})
    monkeypatch.setenv("MINDVL_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    norm = LayerNorm(8)
    with pytest.warns(UserWarning, match=r"fused CPU kernels unavailable \(no C\+\+ compiler"):
        assert use_kernels(norm, "fused") == 0
    assert not isinstance(norm.layer_norm, FusedLayerNorm)
    assert norm(ms.Tensor(np.ones((2, 8), np.float32))).shape == (2, 8)


def test_training_with_the_kernels_follows_training_without(native_path, small_cfg, small_report, tmp_path):
    from conftest import SMALL_MODEL

    from mindvl.config import load_config
    from mindvl.train import train

    losses = {}
    for kind in ("standard", "fused", "auto"):
        cfg = load_config("tiny", [f"data.root={small_cfg.data.root}", "data.batch_size=8", "data.num_workers=1",
                                   "train.max_steps=4", "train.warmup_steps=1", "train.log_every=1",
                                   "train.checkpoint_every=4", f"train.output_dir={tmp_path / kind}", *SMALL_MODEL,
                                   f"train.kernels={kind}"])
        train(cfg, progress=False)
        losses[kind] = [json.loads(line)["loss"] for line in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()
                        if "loss" in json.loads(line)]
    assert len(losses["fused"]) == len(losses["standard"]) == len(losses["auto"]) == 4
    np.testing.assert_allclose(losses["fused"], losses["standard"], rtol=1e-4)
    np.testing.assert_allclose(losses["auto"], losses["standard"], rtol=1e-4)


# (layout, rows, width, out): below 32 rows the decode path (int8 activations when the width is in groups of 32),
# from 32 rows widened blocks through sgemm; per-channel int8 also at widths not in groups of 32
QUANTIZED_CASES = [("int8", 1, 640, 1000), ("int8", 3, 257, 129), ("int8", 7, 64, 300), ("int8", 31, 96, 70),
                   ("int8", 32, 640, 257), ("int8", 40, 130, 70), ("int8/32", 1, 640, 300), ("int8/32", 5, 96, 33),
                   ("int8/32", 40, 64, 70), ("int8/16", 2, 256, 65), ("int8/16", 33, 64, 20), ("int4", 1, 640, 1000),
                   ("int4", 6, 96, 129), ("int4", 31, 64, 40), ("int4", 32, 640, 257), ("int4", 45, 64, 33)]


def _quantized(layout: str, weight: np.ndarray):
    """(standard product, fused class, stored tensors) of one layout."""
    from mindvl.cells.kernels.cpu import FusedInt4MatMul, FusedInt8MatMul
    from mindvl.cells.quant import Int4Product, Int8Product, quantize_int4, quantize_int8

    if layout == "int4":
        return Int4Product(), FusedInt4MatMul, quantize_int4(weight)
    group = int(layout.split("/")[1]) if "/" in layout else None
    return Int8Product(), FusedInt8MatMul, quantize_int8(weight, group)


def _activation_rounding(x: np.ndarray, widened: np.ndarray) -> np.ndarray:
    """(rows, out): how far rounding each row of x to int8 per group of 32 (scale max|x| / 127) can move a product
    with `widened`: sum over groups of scale / 2 * sum |W| over the group's inputs."""
    rows, width = x.shape
    half_steps = np.abs(x.reshape(rows, -1, 32)).max(axis=2) / 127 / 2  # (rows, groups)
    weight_sums = np.abs(widened).reshape(len(widened), -1, 32).sum(axis=2)  # (out, groups)
    return half_steps @ weight_sums.T


@pytest.mark.parametrize("layout, rows, width, out", QUANTIZED_CASES)
def test_quantized_products_equal_the_widened_weights_product(path, layout, rows, width, out):
    """FusedInt8MatMul / FusedInt4MatMul read the quantized weights as they are. Below 32 rows (decode steps, batches
    of streams) each row of x is rounded to int8 per group of 32 and the products summed in integers, as llama.cpp
    does: within that rounding's bound of the standard product (widen the weights, then MatMul); from 32 rows
    (a prefill) widened blocks through sgemm, equal to it."""
    rng = np.random.default_rng(rows * 1000 + width)
    weight = rng.normal(size=(out, width)).astype(np.float32)
    standard, fused, stored = _quantized(layout, weight)
    x = rng.normal(size=(rows, width)).astype(np.float32)
    tensors = [ms.Tensor(x), *(ms.Tensor(t) for t in stored)]
    want = standard(*tensors).asnumpy()
    got = fused(path)(*tensors).asnumpy()
    # x (..., K): the leading axes are rows (QuantizedLinear.project passes a layer's input without a Reshape)
    leading = fused(path)(ms.Tensor(x[None]), *tensors[1:]).asnumpy()
    assert leading.shape == (1, rows, out)
    np.testing.assert_array_equal(leading[0], got)
    widened = standard.dequantize(*tensors[1:]).asnumpy()
    np.testing.assert_allclose(want, x @ widened.T, rtol=1e-4, atol=1e-4)
    if rows < 32 and width % 32 == 0:
        bound = _activation_rounding(x, widened)
        assert (np.abs(got - want) <= bound + 1e-4).all()
        assert np.abs(got - want).max() > 0  # the activations were rounded: the integer path ran
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("layout", ["int8", "int8/32", "int8/16", "int4"])
def test_the_native_and_avx2_builds_give_the_same_quantized_products(layout):
    """The integer sums are exact and both builds scale them into the same 8 float32 lanes in the same order, so an
    AVX-512 machine (VNNI's dpbusd) and an AVX2 one (maddubs) give the same bits."""
    if not _runs_avx2():
        pytest.skip("no AVX2 + FMA")
    rng = np.random.default_rng(7)
    _, fused, stored = _quantized(layout, rng.normal(size=(300, 256)).astype(np.float32))
    tensors = [ms.Tensor(rng.normal(size=(3, 256)).astype(np.float32)), *(ms.Tensor(t) for t in stored)]
    np.testing.assert_array_equal(fused(_built("native"))(*tensors).asnumpy(),
                                  fused(_built("x86-64-v3"))(*tensors).asnumpy())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_linear_takes_its_kernel_and_exports_its_standard_product(native_path, kind):
    from mindvl.cells.kernels.cpu import FusedInt4MatMul, FusedInt8MatMul
    from mindvl.cells.quant import Int4Linear, Int4Product, Int8Linear, Int8Product

    cell, fused, standard_product = {"int8": (Int8Linear, FusedInt8MatMul, Int8Product),
                                     "int4": (Int4Linear, FusedInt4MatMul, Int4Product)}[kind]
    linear = cell.from_linear(Linear(64, 20, has_bias=True))
    assert isinstance(linear, cell)
    x = ms.Tensor(np.random.default_rng(0).normal(size=(2, 20, 64)).astype(np.float32))  # 40 rows: the sgemm path
    standard = linear(x).asnumpy()
    assert use_kernels(linear, "fused", device="CPU") >= 1 and isinstance(linear.product, fused)
    np.testing.assert_allclose(linear(x).asnumpy(), standard, rtol=1e-5, atol=1e-5)
    with standard_kernels(linear):
        assert isinstance(linear.product, standard_product)
    assert isinstance(linear.product, fused)
