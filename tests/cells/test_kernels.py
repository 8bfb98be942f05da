"""Fused CPU kernels (cells/kernels): each against MindSpore's operator, outputs and gradients, over odd
shapes and every eps the recipes use; swapped into a model and out again for exports (no Custom op in
the MindIR); a training run with them follows one without; no compiler -> standard operators + a warning."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindvl.cells import kernels
from mindvl.cells.kernels import FusedLayerNorm, library, standard_kernels, use_kernels
from mindvl.cells.norm import LayerNorm

# float32 sums over a row: outputs and input gradients agree to rounding; the parameter gradients add up
# every row, so they are compared relative to their size
ATOL, PARAM_RTOL = 2e-5, 1e-4


@pytest.fixture(scope="module")
def path():
    built = library()
    if built is None:
        pytest.skip(f"no fused kernels here: {kernels._library.get('failed')}")
    return built


class Loss(nn.Cell):
    """sum(norm(x) * target): its gradient reaches the norm as `target`."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def construct(self, x, target):
        return (self.norm(x) * target).sum()


@pytest.mark.parametrize("shape", [(4, 16), (3, 7, 5), (2, 33, 257), (1, 1, 3)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-12])
def test_layer_norm_matches_mindspore_forward_and_backward(path, shape, eps):
    rng = np.random.default_rng(sum(shape))
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    target = rng.normal(size=shape).astype(np.float32)
    results = []
    for fused in (False, True):
        norm = LayerNorm(shape[-1], eps)
        norm.weight.set_data(ms.Tensor(rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)) if not results
                             else results[0][3])
        norm.bias.set_data(ms.Tensor(np.linspace(-1, 1, shape[-1]).astype(np.float32)))
        if fused:
            norm.layer_norm = FusedLayerNorm(eps, path)
        step = ms.value_and_grad(Loss(norm), 0, norm.trainable_params())
        _, (dx, (dweight, dbias)) = step(ms.Tensor(x), ms.Tensor(target))
        results.append((norm(ms.Tensor(x)).asnumpy(), dx.asnumpy(), (dweight.asnumpy(), dbias.asnumpy()),
                        norm.weight.data))
    (y0, dx0, params0, _), (y1, dx1, params1, _) = results
    np.testing.assert_allclose(y1, y0, atol=ATOL)
    np.testing.assert_allclose(dx1, dx0, atol=ATOL)
    for fused_grad, standard_grad in zip(params1, params0):
        np.testing.assert_allclose(fused_grad, standard_grad, atol=ATOL, rtol=PARAM_RTOL)


def test_a_model_swaps_in_the_kernels_and_exports_standard_operators(path, tmp_path):
    from mindvl.cells import create_model
    from mindvl.config import load_config
    from mindvl.export.lite2 import mindir_ops
    from mindvl.export.package import export_graph
    from mindvl.export.graphs import TensorSpec

    cfg = load_config("tiny", ["model.text.vocab_size=40"])
    model = create_model(cfg.model, cfg.preprocess)
    model.set_train(False)
    encoder = model.text.encoder
    x = ms.Tensor(np.random.default_rng(0).normal(size=(2, 6, cfg.model.text.width)).astype(np.float32))
    before = encoder(x).asnumpy()
    swapped = use_kernels(model, "fused")
    assert swapped == sum(isinstance(c, LayerNorm) for _, c in model.cells_and_names()) > 0
    np.testing.assert_allclose(encoder(x).asnumpy(), before, atol=ATOL)
    exported = export_graph(encoder, "text_stack", [TensorSpec("x", "float32", (2, 6, cfg.model.text.width))],
                            tmp_path / "text_stack.mindir")
    ops_used = mindir_ops(exported.read_bytes())
    assert "Custom" not in ops_used and "LayerNorm" in ops_used
    assert isinstance(encoder.blocks[0].norm1.layer_norm, FusedLayerNorm)  # the training model keeps them
    with standard_kernels(model):
        assert not isinstance(encoder.blocks[0].norm1.layer_norm, FusedLayerNorm)
    assert use_kernels(model, "standard") == 0
    with pytest.raises(ValueError, match="train.kernels: 'turbo'"):
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


def test_training_with_the_kernels_follows_training_without(path, small_cfg, small_report, tmp_path):
    from conftest import SMALL_MODEL

    from mindvl.config import load_config
    from mindvl.train import train

    losses = {}
    for kind in ("standard", "fused"):
        cfg = load_config("tiny", [f"data.root={small_cfg.data.root}", "data.batch_size=8", "data.num_workers=1",
                                   "train.max_steps=4", "train.warmup_steps=1", "train.log_every=1",
                                   "train.checkpoint_every=4", f"train.kernels={kind}",
                                   f"train.output_dir={tmp_path / kind}", *SMALL_MODEL])
        train(cfg, progress=False)
        losses[kind] = [json.loads(line)["loss"] for line in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()
                        if "loss" in json.loads(line)]
    assert len(losses["fused"]) == len(losses["standard"]) == 4
    np.testing.assert_allclose(losses["fused"], losses["standard"], rtol=1e-4)
