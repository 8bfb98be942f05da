"""Packed training computes what each sample computes alone: the text encoder (questions and captions in
shared rows), the audio encoder (clips in shared rows), the fusion, and the whole model, against the padded
layout (one sample per row) and the padded export path (export_nets), at 1e-5 in graph mode.

One small random model (two layers in every stack, so a leak across segments would also travel through a
second layer) and one batch of 8 samples: questions and captions of different lengths (the maximum, 14,
among them), clips of odd, even, maximum (128 frames) and very short (1, 2 frames) lengths, and every
question-modality choice. Each graph compiles once.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from conftest import SMALL_MODEL
from mindvl.cells import (AnswerNet, AudioEmbedNet, EncodeNet, GenerateNet, ImageEmbedNet, StateAnswerNet,
                          StateGenerateNet, TextEmbedNet, TokenInputModel, build_cells)
from mindvl.cells.masks import MASK_VALUE, packed_prefix_lm_mask, prefix_lm_mask
from mindvl.config import load_config
from mindvl.data.reading.loader import TOKEN_COLUMNS
from mindvl.data.reading.packing import (AUDIO_COLUMNS, PACK_COLUMNS, PACK_INPUTS, TEXT_COLUMNS, AudioPacker, FusionLayout,
                                 FusionPacker, Packer, TextPacker)
from mindvl.train.losses import TRAIN_COLUMNS, MultimodalLoss

ms.set_context(mode=ms.GRAPH_MODE)

VOCAB = 50
TEXT_LENGTHS = [9, 14, 5, 7, 3, 12, 4, 14]
CAPTION_LENGTHS = [5, 14, 3, 6, 9, 5, 4, 7]
FRAME_COUNTS = [20, 128, 61, 1, 101, 8, 2, 127]
USE_TEXT = [1, 0, 1, 1, 0, 1, 1, 0]
USE_AUDIO = [0, 1, 0, 1, 1, 0, 1, 1]
BATCH = len(TEXT_LENGTHS)
MODEL_INPUTS = ("answer_in", "image") + PACK_COLUMNS
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
    return load_config("tiny", [*SMALL_MODEL, "model.fusion.layers=2", "model.text.layers=2", "model.audio.layers=2",
                                f"model.text.vocab_size={VOCAB}"])


@pytest.fixture(scope="module")
def model(cfg):
    ms.set_seed(0)
    net = build_cells(cfg.model, cfg.preprocess)
    net.set_train(False)
    return net


def _prefix_masks(lengths, width):
    return (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.float32)


@pytest.fixture(scope="module")
def batch(cfg):
    """numpy inputs of 8 samples, without the packing columns (see `with_layout`)."""
    rng = np.random.default_rng(0)
    pre = cfg.preprocess
    text_len, frames = pre.max_text_length, pre.max_audio_frames
    question_mask = _prefix_masks(TEXT_LENGTHS, text_len)
    caption_mask = _prefix_masks(CAPTION_LENGTHS, text_len)
    audio_mask = _prefix_masks(FRAME_COUNTS, frames)
    answer_tokens = rng.integers(1, VOCAB, (BATCH, pre.max_answer_length)).astype(np.int32)
    answer_tokens[0, -1] = 0  # a padded answer target (ignored by the LM loss)
    return {
        "image": rng.standard_normal((BATCH, 3, pre.image_size, pre.image_size)).astype(np.float32),
        "question_ids": (rng.integers(1, VOCAB, (BATCH, text_len)) * question_mask).astype(np.int32),
        "question_mask": question_mask,
        "audio_mel": (rng.standard_normal((BATCH, pre.n_mels, frames)) * audio_mask[:, None]).astype(np.float32),
        "audio_mask": audio_mask,
        "use_text": np.array(USE_TEXT, np.float32),
        "use_audio": np.array(USE_AUDIO, np.float32),
        "caption_ids": (rng.integers(1, VOCAB, (BATCH, text_len)) * caption_mask).astype(np.int32),
        "caption_mask": caption_mask,
        "answer": rng.integers(0, cfg.model.num_answers, BATCH).astype(np.int32),
        "answer_tokens": answer_tokens,
        "answer_in": answer_tokens[:, :-1].copy(),
        "question_group": np.array([0, 1, 0, 2, 1, 3, 4, 2], np.int32),
        "caption_group": np.array([0, 1, 2, 0, 1, 2, 3, 3], np.int32),
    }


def with_layout(cfg, batch, enabled):
    pre = cfg.preprocess
    packer = Packer(TextPacker(pre.max_text_length, 2 * BATCH, enabled, length=32),
                    AudioPacker(pre.max_audio_frames, BATCH, enabled, frames=256),
                    FusionPacker(FusionLayout.from_config(cfg), BATCH, enabled, length=128))
    packed = packer(*(batch[name] for name in PACK_INPUTS))
    return {**batch, **dict(zip(PACK_COLUMNS, packed.arrays))}


def run(net, inputs, names):
    outputs = net(*(Tensor(inputs[name]) for name in names))
    return [o.asnumpy() for o in outputs] if isinstance(outputs, tuple) else outputs.asnumpy()


class _EncoderPacked(nn.Cell):
    """An encoder's construct_packed as a graph of its own."""

    def __init__(self, encoder):
        super().__init__(auto_prefix=False)
        self.encoder = encoder

    def construct(self, *inputs):
        return self.encoder.construct_packed(*inputs)


@pytest.fixture(scope="module")
def packed(cfg, batch):
    return with_layout(cfg, batch, enabled=True)


@pytest.fixture(scope="module")
def padded(cfg, batch):
    return with_layout(cfg, batch, enabled=False)


@pytest.fixture(scope="module")
def packed_outputs(model, packed):
    return run(model, packed, MODEL_INPUTS)


@pytest.fixture(scope="module")
def export_outputs(model, batch):
    """AnswerNet's probabilities and GenerateNet's LM logits on the padded batch: the export path."""
    return run(AnswerNet(model), batch, EXPORT_INPUTS), run(GenerateNet(model), batch, EXPORT_INPUTS + ("answer_in",))


def test_the_batch_really_packs_several_samples_per_row(cfg, packed, padded):
    pre = cfg.preprocess
    text_segment, audio_segment, fusion_segment = (packed[name] for name in
                                                   ("text_pack_segment", "audio_pack_segment", "pack_segment"))
    assert text_segment.shape[1] == 32 and text_segment.shape[0] < 2 * BATCH
    assert audio_segment.shape[1] == 256 and audio_segment.shape[0] < BATCH
    assert fusion_segment.shape[1] == 128 and fusion_segment.shape[0] < BATCH
    for segments in (text_segment, audio_segment, fusion_segment):
        assert segments.max(axis=1).max() >= 3  # some row holds three or more samples
    # the padded layouts: every sample alone, padded to the longest possible one
    assert padded["text_pack_segment"].shape == (2 * BATCH, pre.max_text_length)
    assert padded["audio_pack_mel"].shape == (BATCH, pre.n_mels, pre.max_audio_frames)
    assert padded["pack_segment"].shape == (BATCH, FusionLayout.from_config(cfg).length)


def test_packed_text_encoder_computes_each_question_and_caption_as_alone(model, batch, packed, padded):
    texts = {"ids": np.concatenate((batch["question_ids"], batch["caption_ids"])),
             "mask": np.concatenate((batch["question_mask"], batch["caption_mask"]))}
    alone_tokens, alone_pooled = run(model.text, texts, ("ids", "mask"))  # padded: one text per row, masked
    valid = texts["mask"] > 0
    for layout in (packed, padded):
        tokens, pooled = run(_EncoderPacked(model.text), layout, TEXT_COLUMNS)
        assert tokens.shape == alone_tokens.shape
        np.testing.assert_allclose(tokens[valid], alone_tokens[valid], atol=1e-5)
        np.testing.assert_allclose(pooled, alone_pooled, atol=1e-5)
        assert np.all(tokens[~valid] == 0)  # slots a text does not have read the zero row
    # each text truly alone, cut to its own length
    for n in (1, 4, 2 * BATCH - 1):
        length = int(valid[n].sum())
        cut = {"ids": texts["ids"][n:n + 1, :length], "mask": texts["mask"][n:n + 1, :length]}
        tokens, _ = run(model.text, cut, ("ids", "mask"))
        np.testing.assert_allclose(tokens[0], alone_tokens[n, :length], atol=1e-5)


def test_packed_audio_encoder_computes_each_clip_as_alone(model, batch, packed, padded):
    alone_tokens, token_mask, alone_pooled = run(model.audio, batch, ("audio_mel", "audio_mask"))
    valid = token_mask > 0
    assert valid.sum(1).tolist() == [(f + 1) // 2 for f in FRAME_COUNTS]
    for layout in (packed, padded):
        tokens, pooled = run(_EncoderPacked(model.audio), layout, AUDIO_COLUMNS)
        assert tokens.shape == alone_tokens.shape
        np.testing.assert_allclose(tokens[valid], alone_tokens[valid], atol=1e-5)
        np.testing.assert_allclose(pooled, alone_pooled, atol=1e-5)
        assert np.all(tokens[~valid] == 0)
    # each clip truly alone, cut to its own (even) length: the conv sees the zeros it sees when packed
    for b in (0, 2, 3, 6, 7):  # 20, 61, 1, 2 and 127 frames
        frames = FRAME_COUNTS[b] + FRAME_COUNTS[b] % 2
        cut = {"mel": batch["audio_mel"][b:b + 1, :, :frames], "mask": batch["audio_mask"][b:b + 1, :frames]}
        tokens, _, pooled = run(model.audio, cut, ("mel", "mask"))
        n = (FRAME_COUNTS[b] + 1) // 2
        np.testing.assert_allclose(tokens[0, :n], alone_tokens[b, :n], atol=1e-5)
        np.testing.assert_allclose(pooled[0], alone_pooled[b], atol=1e-5)


def test_audio_clips_do_not_leak_into_each_other(model, batch, packed):
    """Changing one clip's frames changes only that clip's outputs, though it shares a row with others."""
    tokens, pooled = run(_EncoderPacked(model.audio), packed, AUDIO_COLUMNS)
    frames = packed["audio_pack_segment"]
    row = int(np.flatnonzero((frames.max(axis=1) >= 3))[0])  # a row holding three or more clips
    other = dict(packed)
    other["audio_pack_mel"] = packed["audio_pack_mel"].copy()
    other["audio_pack_mel"][row][:, frames[row] == 2] *= -1.5  # the row's second clip
    new_tokens, new_pooled = run(_EncoderPacked(model.audio), other, AUDIO_COLUMNS)
    token_rows = packed["audio_index"] // (frames.shape[1] // 2)
    token_segment = frames[:, ::2].reshape(-1)
    first_token = packed["audio_index"][:, 0]
    changed = [b for b in range(BATCH) if token_rows[b, 0] == row and token_segment[first_token[b]] == 2]
    assert len(changed) == 1
    for b in range(BATCH):
        if b in changed:
            assert np.abs(new_pooled[b] - pooled[b]).max() > 1e-3
        else:
            np.testing.assert_allclose(new_pooled[b], pooled[b], atol=1e-6)
            np.testing.assert_allclose(new_tokens[b], tokens[b], atol=1e-6)


def test_a_packed_batch_computes_what_the_padded_layout_computes(model, padded, packed_outputs):
    alone = run(model, padded, MODEL_INPUTS)  # every stream one sample per row: each sample alone
    for got, want in zip(packed_outputs, alone):  # answer logits, LM logits, 4 embeddings, scales
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_token_input_graph_from_the_encoders_states_computes_the_full_model(model, batch, packed,
                                                                               packed_outputs):
    """TokenInputModel (training from cached frozen-encoder states) gives the full model's outputs when
    fed what its encoders compute for each sample alone, zeroed at padding as the cache stores them."""
    image_tokens = model.vision(Tensor(batch["image"]))[0].asnumpy()
    states = {"image_tokens": image_tokens}
    for kind in ("question", "caption"):
        mask = batch[f"{kind}_mask"]
        tokens = model.text(Tensor(batch[f"{kind}_ids"]), Tensor(mask))[0].asnumpy()
        states[f"{kind}_tokens"] = tokens * mask[:, :, None]
    audio_tokens, token_mask, _ = model.audio(Tensor(batch["audio_mel"]), Tensor(batch["audio_mask"]))
    states["audio_tokens"] = audio_tokens.asnumpy() * token_mask.asnumpy()[:, :, None]
    inputs = {**packed, **states}
    got = run(TokenInputModel(model), inputs, ("answer_in", *TOKEN_COLUMNS))
    for name, a, b in zip(("answer", "lm", "image", "caption", "audio", "question", "scale", "scale"), got,
                          packed_outputs):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
    assert sorted(p.name for p in TokenInputModel(model).get_parameters()) == sorted(
        p.name for p in model.get_parameters())  # the model's own names: checkpoints stay the model's


def test_evaluation_from_encoder_states_computes_what_the_export_graphs_compute(model, batch, export_outputs):
    """EncodeNet once, then StateAnswerNet / StateGenerateNet: AnswerNet's and GenerateNet's outputs."""
    image_tokens, question_tokens, audio_tokens = run(EncodeNet(model), batch, EXPORT_INPUTS[:5])
    states = {**batch, "image_tokens": image_tokens, "question_tokens": question_tokens,
              "audio_tokens": audio_tokens}
    names = ("image_tokens", "question_tokens", "question_mask", "audio_tokens", "audio_mask", "use_text",
             "use_audio")
    np.testing.assert_allclose(run(StateAnswerNet(model), states, names), export_outputs[0], atol=1e-6)
    np.testing.assert_allclose(run(StateGenerateNet(model), states, names + ("answer_in",)), export_outputs[1],
                               atol=1e-5)


def test_packed_training_equals_the_padded_export_path(model, batch, packed_outputs, export_outputs):
    answer_logits, lm_logits, image_emb, caption_emb, audio_emb, question_emb = packed_outputs[:6]
    # Export: fusion.construct / construct_prefix over the padded table, with text_mask = question_mask *
    # use_text and audio token mask = audio_mask[:, ::2] * use_audio (MultimodalModel.fusion_inputs).
    probs, export_lm_logits = export_outputs
    expected = np.exp(answer_logits - answer_logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, expected / expected.sum(-1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(export_lm_logits, lm_logits, atol=1e-5)
    np.testing.assert_allclose(run(ImageEmbedNet(model), batch, ("image",)), image_emb, atol=1e-5)
    text_embed = TextEmbedNet(model)  # captions and questions: same shapes, one graph
    np.testing.assert_allclose(run(text_embed, batch, ("caption_ids", "caption_mask")), caption_emb, atol=1e-5)
    np.testing.assert_allclose(run(text_embed, batch, ("question_ids", "question_mask")), question_emb, atol=1e-5)
    np.testing.assert_allclose(run(AudioEmbedNet(model), batch, ("audio_mel", "audio_mask")), audio_emb, atol=1e-5)
    assert np.abs(answer_logits[0] - answer_logits[1]).max() > 1e-3  # samples differ: the check has teeth
    assert np.abs(audio_emb[1] - audio_emb[7]).max() > 1e-3


def test_gradients_of_the_packed_loss_are_finite_and_reach_every_used_modality(cfg, packed):
    model = build_cells(cfg.model, cfg.preprocess)  # its own: wrapping in the loss prefixes parameter names
    params = model.trainable_params()
    names = [p.name for p in params]
    loss_net = MultimodalLoss(model, cfg.train.loss_weights)
    grad_fn = ops.value_and_grad(loss_net, None, params, has_aux=True)
    (total, parts), grads = grad_fn(*(Tensor(packed[name]) for name in TRAIN_COLUMNS))
    assert np.isfinite(total.asnumpy()) and np.isfinite(parts.asnumpy()).all()
    grads = {name: g.asnumpy() for name, g in zip(names, grads)}
    assert all(np.isfinite(g).all() for g in grads.values())
    for name in ("fusion.image_in_proj.weight", "fusion.text_in_proj.weight", "fusion.audio_in_proj.weight",
                 "fusion.answer_embeddings.weight", "fusion.encoder.blocks.1.attn.q_proj.weight",
                 "text.word_embeddings.weight", "text.position_embeddings.weight",
                 "text.encoder.blocks.1.mlp.fc1.weight",
                 "audio.conv1.weight", "audio.conv2.weight", "audio.encoder.blocks.1.attn.k_proj.weight"):
        assert np.abs(grads[name]).max() > 0, name
