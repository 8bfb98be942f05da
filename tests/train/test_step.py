"""The compiled train step on real batches: a forced float16 overflow and a NaN batch are skipped
without touching the weights, the loss scale follows (and survives a checkpoint with the learned loss
weights), gradient accumulation equals the big batch and recomputation changes nothing."""
import mindspore as ms
import numpy as np
import pytest

from mindvl.config import load_config
from mindvl.train import Trainer, TrainingArguments, create_model
from mindvl.train.checkpoint import model_state

from conftest import SMALL_MODEL  # noqa: E402  (tests/conftest.py)


def _trainer(small_cfg, tmp_path, *overrides):
    cfg = load_config("tiny", [f"data.root={small_cfg.data.root}", f"train.output_dir={tmp_path}", "data.batch_size=8",
                               "data.num_workers=1", "train.warmup_steps=1", "train.max_steps=4", *SMALL_MODEL,
                               *overrides])
    return Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))


def _batches(trainer, count):
    stream = iter(trainer.stream)
    batches = [next(stream)[1] for _ in range(count)]
    stream.close()
    return batches


def _weights(trainer):
    return {name: value.copy() for name, value in model_state(trainer.model).items()}  # asnumpy may alias


def _same(before, after):
    return all(np.array_equal(before[name], after[name]) for name in before)


@pytest.fixture(scope="module")
def float16(small_cfg, small_report, tmp_path_factory):
    """A float16 trainer whose first loss scale (2^24) overflows float16 gradients."""
    trainer = _trainer(small_cfg, tmp_path_factory.mktemp("fp16"), "train.precision.compute=float16",
                       "train.loss_scale.init=16777216", "train.loss_weighting=uncertainty")
    trainer.train_step.set_train(True)
    return trainer, _batches(trainer, 2)


def test_a_float16_overflow_skips_the_step_lowers_the_scale_and_keeps_the_weights(float16):
    trainer, batches = float16
    before = _weights(trainer)
    loss, parts, norms, finite, scale = trainer.train_step(True, *batches[0])
    assert not bool(finite.asnumpy()) and float(scale.asnumpy()) == 2 ** 23
    assert np.isfinite(loss.asnumpy())  # the loss itself was fine: the scaled float16 gradients overflowed
    assert _same(before, _weights(trainer))
    trainer.scaler.scale_value.set_data(ms.Tensor(1024.0, ms.float32))
    _, _, norms, finite, scale = trainer.train_step(True, *batches[0])
    assert bool(finite.asnumpy()) and float(scale.asnumpy()) == 1024.0
    after = _weights(trainer)
    assert not _same(before, after) and all(np.isfinite(v).all() for v in after.values())
    assert np.all(norms.asnumpy() > 0)  # every module got gradient, measured after unscaling


def test_a_nan_in_the_batch_is_skipped_without_touching_the_weights(float16):
    trainer, batches = float16
    columns = list(trainer.stream.columns)
    image = batches[1][columns.index("image")].asnumpy().copy()
    image[0, 0, 0, 0] = np.nan
    poisoned = list(batches[1])
    poisoned[columns.index("image")] = ms.Tensor(image)
    before = _weights(trainer)
    scale_before = float(trainer.scaler.scale_value.asnumpy())
    loss, _, _, finite, scale = trainer.train_step(True, *poisoned)
    assert not np.isfinite(loss.asnumpy()) and not bool(finite.asnumpy())
    assert _same(before, _weights(trainer))
    assert float(scale.asnumpy()) == scale_before / 2


def test_loss_scale_and_learned_loss_weights_survive_a_checkpoint(float16, tmp_path):
    from mindvl.train.checkpoint import load_optimizer_state

    trainer, batches = float16
    trainer.train_step(True, *batches[0])
    weighting = trainer.loss_net.weighting
    assert not np.allclose(weighting.effective_weights(), [0.5, 1.0, 0.5])  # the weights were learned
    checkpoint = trainer._save(1, {}, None)
    scale, log_variance = trainer.scaler.scale_value.asnumpy(), weighting.log_variance.asnumpy().copy()
    resumed = Trainer(create_model(trainer.cfg), TrainingArguments(trainer.cfg, resume=str(checkpoint), progress=False))
    assert resumed.start_step == 1
    assert float(resumed.scaler.scale_value.asnumpy()) == float(scale)
    np.testing.assert_array_equal(resumed.loss_net.weighting.log_variance.asnumpy(), log_variance)
    moments = {id(p): m.asnumpy() for p, m in zip(resumed.optimizer.parameters, resumed.optimizer.moments1)}
    assert np.abs(moments[id(resumed.loss_net.weighting.log_variance)]).max() > 0  # its Adam state came back
    assert load_optimizer_state(resumed.model, resumed.optimizer, checkpoint)["loss_scale_counter"] is not None


def test_two_accumulated_micro_batches_equal_one_batch_of_both(small_cfg, small_report, tmp_path):
    # answer and LM losses are means over samples, so 2 x 4 samples give the gradient of 1 x 8; the
    # contrastive loss's negatives are per micro-batch, so it is off here
    common = ("train.loss_weights.contrastive=0", "train.grad_clip=0")
    whole = _trainer(small_cfg, tmp_path / "whole", *common)
    split = _trainer(small_cfg, tmp_path / "split", *common, "train.grad_accumulation=2")
    recomputed = _trainer(small_cfg, tmp_path / "recomputed", *common, "train.modules.fusion.recompute=[0]",
                          "train.modules.audio.recompute=[0]")
    assert split.stream.micro_batch_size == 4 and whole.stream.micro_batch_size == 8
    norms = []
    for trainer in (whole, split, recomputed):
        trainer.train_step.set_train(True)
        micro = _batches(trainer, trainer.stream.accumulation)
        for index, batch in enumerate(micro):
            out = trainer.train_step(index == len(micro) - 1, *batch)
        norms.append(out[2].asnumpy())
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-5)  # per-module gradient norms of the step
    np.testing.assert_allclose(norms[2], norms[0], rtol=1e-6)  # recomputing blocks changes no gradient
    want, got, again = _weights(whole), _weights(split), _weights(recomputed)
    for name in want:
        # float32 sums in another order: Adam's first update, g / (|g| + eps) * lr, turns a 1e-7 gradient
        # difference on a near-zero gradient into a few percent of lr (1e-3)
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(again[name], want[name], rtol=0, atol=1e-6, err_msg=name)
