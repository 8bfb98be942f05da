"""Objectives against numpy references, in graph mode; the training column order."""
import inspect

import mindspore as ms
import numpy as np
import pytest

from mindvl.cells import MultimodalModel
from mindvl.data.reading.loader import LABEL_COLUMNS, MODEL_COLUMNS, TOKEN_COLUMNS
from mindvl.data.reading.packing import PACK_COLUMNS
from mindvl.config import LossWeights
from mindvl.train.losses import TRAIN_COLUMNS, GroupContrastiveLoss, LMLoss, LossWeighting, MultimodalLoss
from mindvl.train.schedule import warmup_cosine


def _log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)


def test_group_contrastive_matches_numpy_and_treats_equal_groups_as_positives():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 8)).astype(np.float32)
    b = rng.normal(size=(6, 8)).astype(np.float32)
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    groups = np.array([0, 1, 0, 2, 1, 3], dtype=np.int32)
    got = GroupContrastiveLoss()(ms.Tensor(a), ms.Tensor(b), ms.Tensor(10.0, ms.float32), ms.Tensor(groups))
    logits = 10.0 * a @ b.T
    targets = (groups[:, None] == groups[None, :]).astype(np.float32)
    targets /= targets.sum(axis=1, keepdims=True)
    want = (-(targets * _log_softmax(logits)).sum(1).mean() - (targets * _log_softmax(logits.T)).sum(1).mean()) / 2
    assert got.asnumpy() == pytest.approx(want, abs=1e-5)


def test_group_contrastive_is_lowest_when_matching_pairs_align():
    emb = np.eye(4, dtype=np.float32)
    groups = ms.Tensor(np.arange(4, dtype=np.int32))
    loss = GroupContrastiveLoss()
    aligned = loss(ms.Tensor(emb), ms.Tensor(emb), ms.Tensor(20.0, ms.float32), groups).asnumpy()
    shuffled = loss(ms.Tensor(emb), ms.Tensor(emb[::-1].copy()), ms.Tensor(20.0, ms.float32), groups).asnumpy()
    assert aligned < 1e-3 < shuffled


def test_lm_loss_ignores_padding_targets_and_averages_per_sample():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = np.array([[3, 2, 0], [4, 0, 0]], dtype=np.int32)
    got = LMLoss(pad_id=0)(ms.Tensor(logits), ms.Tensor(targets)).asnumpy()
    logp = _log_softmax(logits.reshape(6, 5)).reshape(2, 3, 5)
    want = -np.mean([np.mean([logp[0, 0, 3], logp[0, 1, 2]]), logp[1, 0, 4]])
    assert got == pytest.approx(want, abs=1e-5)
    # a mean of per-sample means: the two halves of a batch average to the whole batch's loss
    halves = [LMLoss()(ms.Tensor(logits[i:i + 1]), ms.Tensor(targets[i:i + 1])).asnumpy() for i in (0, 1)]
    assert np.mean(halves) == pytest.approx(got, abs=1e-6)


def test_fixed_weighting_is_the_weighted_sum():
    weights = LossWeights(contrastive=0.5, answer=1.0, lm=0.25)
    parts = ms.Tensor(np.array([2.0, 3.0, 4.0], np.float32))
    assert LossWeighting(weights)(parts).asnumpy() == pytest.approx(0.5 * 2 + 3 + 0.25 * 4)


def test_uncertainty_weighting_starts_at_the_fixed_mix_learns_and_keeps_zero_weights_off():
    weights = LossWeights(contrastive=0.5, answer=1.0, lm=0.0)
    weighting = LossWeighting(weights, "uncertainty")
    np.testing.assert_allclose(weighting.effective_weights(), [0.5, 1.0, 0.0], atol=1e-6)
    parts = ms.Tensor(np.array([2.0, 3.0, 4.0], np.float32))
    total = weighting(parts).asnumpy()  # sum of w_i L_i + log(1 / w_i) over the active objectives
    assert total == pytest.approx(0.5 * 2 + 3 + np.log(2.0), abs=1e-5)
    grads = ms.grad(weighting, grad_position=None, weights=weighting.trainable_params())(parts)[0].asnumpy()
    # d/ds_i = 1 - exp(-s_i) L_i: a large loss pushes its log variance up (its weight down)
    np.testing.assert_allclose(grads, [1 - 0.5 * 2, 1 - 3, 0.0], atol=1e-5)


def test_train_columns_name_the_loss_and_model_arguments_in_order_ending_with_the_packing_columns():
    labels = list(inspect.signature(MultimodalLoss.construct).parameters)[1:-1]  # after self, before *inputs
    assert list(LABEL_COLUMNS) == labels and TRAIN_COLUMNS[:len(labels)] == LABEL_COLUMNS
    model_arguments = list(inspect.signature(MultimodalModel.construct).parameters)[2:]  # after self, answer_in
    assert list(MODEL_COLUMNS) == model_arguments == list(TRAIN_COLUMNS[len(labels):])
    token_arguments = list(inspect.signature(MultimodalModel.construct_from_tokens).parameters)[2:]
    assert list(TOKEN_COLUMNS) == token_arguments
    assert TRAIN_COLUMNS[-len(PACK_COLUMNS):] == PACK_COLUMNS
    assert "use_text" not in TRAIN_COLUMNS and "use_audio" not in TRAIN_COLUMNS  # the packer applies them
    for padded in ("question_ids", "question_mask", "caption_ids", "caption_mask", "audio_mel", "audio_mask"):
        assert padded not in TRAIN_COLUMNS  # texts and clips reach the training graph packed only


def test_warmup_cosine_rises_then_decays_to_min():
    lrs = warmup_cosine(1e-3, 1e-5, warmup_steps=10, total_steps=100)
    assert lrs.shape == (100,)
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-3)
    assert np.all(np.diff(lrs[10:]) <= 0)
    assert lrs[-1] == pytest.approx(1e-5, rel=0.05)
