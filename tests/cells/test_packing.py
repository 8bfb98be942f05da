"""Packed fusion: a sample packed with others computes exactly what it computes alone, and training (packed
rows, mindvl.data.packing) computes what deployment (padded sequences with flag masks, export_nets) does.

One small random model and one batch of 6 samples with different question lengths, clip lengths (one odd)
and question modalities; each graph compiles once.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from conftest import SMALL_MODEL
from mindvl.cells import AnswerNet, GenerateNet, create_model
from mindvl.cells.masks import MASK_VALUE, packed_prefix_lm_mask, prefix_lm_mask
from mindvl.config import load_config
from mindvl.data.packing import PACK_COLUMNS, FusionLayout, Packer
from mindvl.train.losses import TRAIN_COLUMNS, MultimodalLoss

ms.set_context(mode=ms.GRAPH_MODE)

VOCAB = 50
TEXT_LENGTHS = [9, 14, 5, 7, 3, 12]
FRAME_COUNTS = [20, 128, 61, 40, 101, 8]
USE_TEXT = [1, 0, 1, 1, 0, 1]
USE_AUDIO = [0, 1, 0, 1, 1, 0]
MODEL_INPUTS = ("image", "question_ids", "question_mask", "audio_mel", "audio_mask", "caption_ids", "caption_mask",
                "answer_in") + PACK_COLUMNS
EXPORT_INPUTS = ("image", "question_ids", "question_mask", "audio_mel", "audio_mask", "use_text", "use_audio")


class _Masks(nn.Cell):
    def construct(self, segments, answer_flag, prefix_valid):
        return packed_prefix_lm_mask(segments, answer_flag), prefix_lm_mask(prefix_valid, 2)


def test_packed_prefix_lm_mask_is_block_diagonal_prefix_lm():
    # Row 0: sample 1 = 2 prefix + 2 answer tokens, sample 2 = 1 prefix + 1 answer, then 1 padding slot.
    # Row 1: one sample laid out like prefix_lm_mask's sequence below (valid prefix 0, 1; 2 answers).
    segments = np.array([[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0, 0]], np.int32)
    answer_flag = np.array([[0, 0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0, 0]], np.float32)
    packed, unpacked = _Masks()(Tensor(segments), Tensor(answer_flag), Tensor(np.array([[1, 1, 0]], np.float32)))
    packed, unpacked = packed.asnumpy(), unpacked.asnumpy()
    allowed_row0 = np.array([[1, 1, 0, 0, 0, 0, 0],   # prefix queries: own prefix only
                             [1, 1, 0, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0, 0],   # answer 0: prefix + itself
                             [1, 1, 1, 1, 0, 0, 0],   # answer 1: prefix + answers 0, 1
                             [0, 0, 0, 0, 1, 0, 0],   # sample 2's prefix: never sample 1
                             [0, 0, 0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 0, 0, 0]])  # padding query sees nothing
    assert packed.shape == (2, 1, 7, 7)
    np.testing.assert_array_equal(packed[0, 0], (1 - allowed_row0) * MASK_VALUE)
    # Row 1 is prefix_lm_mask over the same sample with its padding slot dropped.
    keep = [0, 1, 3, 4]  # prefix_lm's token 2 is the invalid prefix slot
    np.testing.assert_array_equal(packed[1, 0, :4, :4], unpacked[0, 0][np.ix_(keep, keep)])
    assert np.all(packed[1, 0, 4:] == MASK_VALUE) and np.all(packed[1, 0, :, 4:] == MASK_VALUE)


# ------------------------------------------------------------------------------------------ the model

@pytest.fixture(scope="module")
def cfg():
    # Two fusion layers so that a leak across segments would also travel through a second layer.
    return load_config("tiny", [*SMALL_MODEL, "model.fusion.layers=2", f"model.text.vocab_size={VOCAB}"])


@pytest.fixture(scope="module")
def model(cfg):
    ms.set_seed(0)
    net = create_model(cfg.model, cfg.preprocess)
    net.set_train(False)
    return net


@pytest.fixture(scope="module")
def batch(cfg):
    """numpy inputs of 6 samples, without the packing columns (see `packed`)."""
    rng = np.random.default_rng(0)
    pre = cfg.preprocess
    n, text_len, frames = len(TEXT_LENGTHS), pre.max_text_length, pre.max_audio_frames
    question_mask = (np.arange(text_len)[None] < np.array(TEXT_LENGTHS)[:, None]).astype(np.float32)
    audio_mask = (np.arange(frames)[None] < np.array(FRAME_COUNTS)[:, None]).astype(np.float32)
    answer_tokens = rng.integers(1, VOCAB, (n, pre.max_answer_length)).astype(np.int32)
    answer_tokens[0, -1] = 0  # a padded answer target (ignored by the LM loss)
    return {
        "image": rng.standard_normal((n, 3, pre.image_size, pre.image_size)).astype(np.float32),
        "question_ids": (rng.integers(1, VOCAB, (n, text_len)) * question_mask).astype(np.int32),
        "question_mask": question_mask,
        "audio_mel": (rng.standard_normal((n, pre.n_mels, frames)) * audio_mask[:, None]).astype(np.float32),
        "audio_mask": audio_mask,
        "use_text": np.array(USE_TEXT, np.float32),
        "use_audio": np.array(USE_AUDIO, np.float32),
        "caption_ids": rng.integers(1, VOCAB, (n, text_len)).astype(np.int32),
        "caption_mask": np.ones((n, text_len), np.float32),
        "answer": rng.integers(0, cfg.model.num_answers, n).astype(np.int32),
        "answer_tokens": answer_tokens,
        "answer_in": answer_tokens[:, :-1].copy(),
        "question_group": np.array([0, 1, 0, 2, 1, 3], np.int32),
        "caption_group": np.array([0, 1, 2, 0, 1, 2], np.int32),
    }


def with_layout(cfg, batch, enabled):
    packer = Packer(FusionLayout.from_config(cfg), len(TEXT_LENGTHS), enabled=enabled, length=128)
    packed = packer(batch["question_mask"], batch["audio_mask"], batch["use_text"], batch["use_audio"])
    return {**batch, **dict(zip(PACK_COLUMNS, packed.arrays))}


def run(net, inputs, names):
    outputs = net(*(Tensor(inputs[name]) for name in names))
    return [o.asnumpy() for o in outputs] if isinstance(outputs, tuple) else outputs.asnumpy()


@pytest.fixture(scope="module")
def packed(cfg, batch):
    return with_layout(cfg, batch, enabled=True)


@pytest.fixture(scope="module")
def packed_outputs(model, packed):
    return run(model, packed, MODEL_INPUTS)


def test_the_batch_really_packs_several_samples_per_row(packed):
    segments = packed["pack_segment"]
    assert segments.shape == (3, 128)  # 6 samples in 3 rows of 128 instead of 6 rows of 99
    assert (segments.max(axis=1) == 2).all()


def test_a_packed_sample_computes_what_it_computes_alone(model, cfg, batch, packed_outputs):
    padded = with_layout(cfg, batch, enabled=False)  # one sample per row: each sample alone in the fusion
    assert padded["pack_segment"].shape == (6, FusionLayout.from_config(cfg).length)
    alone = run(model, padded, MODEL_INPUTS)
    for got, want in zip(packed_outputs, alone):  # answer logits, LM logits, embeddings, scales
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_packed_training_equals_the_padded_export_path(model, batch, packed_outputs):
    answer_logits, lm_logits = packed_outputs[:2]
    # Export: fusion.construct / construct_prefix over the padded table, with text_mask = question_mask *
    # use_text and audio token mask = audio_mask[:, ::2] * use_audio (MultimodalModel.fusion_inputs).
    probs = run(AnswerNet(model), batch, EXPORT_INPUTS)
    expected = np.exp(answer_logits - answer_logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, expected / expected.sum(-1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(run(GenerateNet(model), batch, EXPORT_INPUTS + ("answer_in",)), lm_logits,
                               atol=1e-5)
    assert np.abs(answer_logits[0] - answer_logits[1]).max() > 1e-3  # samples differ: the check has teeth


def test_gradients_of_the_packed_loss_are_finite_and_reach_every_used_modality(cfg, packed):
    model = create_model(cfg.model, cfg.preprocess)  # its own: wrapping in the loss prefixes parameter names
    params = model.trainable_params()
    names = [p.name for p in params]
    loss_net = MultimodalLoss(model, cfg.train.loss_weights)
    grad_fn = ops.value_and_grad(loss_net, None, params, has_aux=True)
    (total, parts), grads = grad_fn(*(Tensor(packed[name]) for name in TRAIN_COLUMNS))
    assert np.isfinite(total.asnumpy()) and np.isfinite(parts.asnumpy()).all()
    grads = {name: g.asnumpy() for name, g in zip(names, grads)}
    assert all(np.isfinite(g).all() for g in grads.values())
    for name in ("fusion.image_in_proj.weight", "fusion.text_in_proj.weight", "fusion.audio_in_proj.weight",
                 "fusion.answer_embeddings.weight", "fusion.encoder.blocks.1.attn.q_proj.weight"):
        assert np.abs(grads[name]).max() > 0, name
