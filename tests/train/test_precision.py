"""The precision policy: which cells compute in which dtype, what the network hands the objectives,
and the policies that are refused."""
import mindspore as ms
import numpy as np
import pytest

from mindvl.cells import build_cells
from mindvl.errors import ConfigError
from mindvl.config import PrecisionConfig, load_config
from mindvl.runs import parameter_paths
from mindvl.train.precision import NoLossScaling, apply_precision, set_objective_precision
from mindvl.train.losses import AnswerLoss

from conftest import SMALL_MODEL  # noqa: E402  (tests/conftest.py)


def _model(seed=0):
    cfg = load_config("tiny", SMALL_MODEL)
    cfg.model.text.vocab_size = 40
    ms.set_seed(seed)
    return build_cells(cfg.model, cfg.preprocess)


@pytest.fixture(scope="module")
def images():
    ms.set_context(mode=ms.GRAPH_MODE)
    return ms.Tensor(np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32))


def test_float16_policy_runs_projections_in_float16_and_keeps_norm_and_softmax_float32(images):
    reference = _model()
    want = reference.vision(images)[0].asnumpy()
    model = _model()
    network = apply_precision(model, PrecisionConfig(compute="float16"))
    block = model.vision.encoder.blocks[0]
    assert block.attn.q_proj.get_flags()["fp16"] and block.mlp.get_flags()["fp16"]
    for island in (block.norm1, block.attn.core.softmax):  # amp's float32 islands hand float16 back
        assert island._backbone.get_flags()["fp32"] and not island._backbone.get_flags()["fp16"]
    assert list(parameter_paths(model)) == list(parameter_paths(reference))  # checkpoints see the same names
    assert all(p.dtype == ms.float32 for p in model.get_parameters())  # float32 master weights
    got = model.vision(images)[0]
    assert got.dtype == ms.float16
    error = np.abs(got.asnumpy().astype(np.float32) - want).max()
    assert 0 < error < 0.05 * np.abs(want).max()  # really float16, and still the same function
    assert type(network).__name__ == "_OutputTo32"  # the objectives receive float32


def test_float32_policy_leaves_the_network_alone():
    model = _model()
    assert apply_precision(model, PrecisionConfig()) is model
    assert not model.vision.encoder.blocks[0].attn.q_proj.get_flags().get("fp16", False)


def test_objectives_follow_the_loss_dtype():
    loss = AnswerLoss()
    set_objective_precision([loss], PrecisionConfig(compute="float16", loss="float16"))
    assert loss.get_flags()["fp16"]
    kept = AnswerLoss()
    set_objective_precision([kept], PrecisionConfig(compute="float16"))
    assert not kept.get_flags().get("fp16", False)


def test_bfloat16_needs_an_ascend_chip():
    with pytest.raises(ConfigError, match="bfloat16 needs an Ascend chip"):
        apply_precision(_model(), PrecisionConfig(compute="bfloat16"))


@pytest.mark.parametrize("overrides, match", [
    (["train.precision.norm=float16"], "inside a float32 network"),
    (["train.precision.compute=float16", "train.precision.loss=bfloat16"], "one low-precision dtype"),
    (["train.precision.compute=float8"], "expected one of"),
    (["train.loss_scale.factor=1"], "expected > 1"),
])
def test_inconsistent_policies_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("tiny", overrides)


def test_no_loss_scaling_passes_loss_and_gradients_through_untouched():
    scaler = NoLossScaling()
    loss, grads = ms.Tensor(2.5), (ms.Tensor(np.ones(3, np.float32)), ms.Tensor(np.zeros((2, 2), np.float32)))
    assert scaler.scale(loss) is loss and scaler.unscale(grads) is grads  # no multiply by 1 per gradient
    assert float(scaler.scale_value.asnumpy()) == 1.0  # what the logs and checkpoints record
