"""The tiny MultimodalModel: output shapes, mask semantics (padding, prefix LM, modality switch),
export wrappers equal to the training graph, stable parameter names. The training graph runs packed with
the recipe's packing (tests/cells/test_packed_model.py covers packing itself).

One model and one batch per module; each graph compiles once (same shapes reuse the compiled graph).
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindvl.cells import (AnswerNet, AudioEmbedNet, GenerateNet, ImageEmbedNet, MultimodalModel, TextEmbedNet,
                          build_cells)
from mindvl.config import load_config
from mindvl.data.reading.packing import PACK_COLUMNS, PACK_INPUTS, Packer

ms.set_context(mode=ms.GRAPH_MODE)

VOCAB, BATCH, TEXT_LEN, ANSWER_LEN = 50, 3, 14, 3
FRAMES = load_config("tiny").preprocess.max_audio_frames
FRAME_COUNTS = [121, FRAMES, 60]  # valid mel frames per sample: odd, full, short
INPUT_NAMES = ("answer_in", "image") + PACK_COLUMNS
EXPORT_INPUTS = ("image", "question_ids", "question_mask", "audio_mel", "audio_mask", "use_text", "use_audio")


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny", [f"model.text.vocab_size={VOCAB}"])


@pytest.fixture(scope="module")
def model(cfg):
    ms.set_seed(0)
    net = build_cells(cfg.model, cfg.preprocess)
    net.set_train(False)
    return net


@pytest.fixture(scope="module")
def batch(cfg):
    """numpy inputs: sample 0 has padded text and audio, sample 1 is full, sample 2 is short (the training
    graph's packed columns: `packed`)."""
    rng = np.random.default_rng(0)
    size, n_mels = cfg.preprocess.image_size, cfg.preprocess.n_mels
    text_lengths, frame_counts = [9, TEXT_LEN, 5], FRAME_COUNTS
    question_mask = (np.arange(TEXT_LEN)[None] < np.array(text_lengths)[:, None]).astype(np.float32)
    audio_mask = (np.arange(FRAMES)[None] < np.array(frame_counts)[:, None]).astype(np.float32)
    use_text, use_audio = np.array([1, 1, 0], np.float32), np.array([1, 0, 1], np.float32)
    return {
        "image": rng.standard_normal((BATCH, 3, size, size)).astype(np.float32),
        "question_ids": (rng.integers(1, VOCAB, (BATCH, TEXT_LEN)) * question_mask).astype(np.int32),
        "question_mask": question_mask,
        "audio_mel": (rng.standard_normal((BATCH, n_mels, FRAMES)) * audio_mask[:, None]).astype(np.float32),
        "audio_mask": audio_mask,
        "use_text": use_text,
        "use_audio": use_audio,
        "caption_ids": rng.integers(1, VOCAB, (BATCH, TEXT_LEN)).astype(np.int32),
        "caption_mask": np.ones((BATCH, TEXT_LEN), np.float32),
        "answer_in": rng.integers(1, VOCAB, (BATCH, ANSWER_LEN)).astype(np.int32),
    }


def packed(cfg, batch):
    """`batch` and its packed layout with the recipe's packing: what the training graph takes."""
    columns = Packer.from_config(cfg, BATCH)(*(batch[name] for name in PACK_INPUTS)).arrays
    return {**batch, **dict(zip(PACK_COLUMNS, columns))}


def run(net, inputs, names=INPUT_NAMES):
    outputs = net(*(Tensor(inputs[name]) for name in names))
    return [o.asnumpy() for o in outputs] if isinstance(outputs, tuple) else outputs.asnumpy()


@pytest.fixture(scope="module")
def outputs(cfg, model, batch):
    return run(model, packed(cfg, batch))


@pytest.fixture(scope="module")
def answer_net(model):
    """AnswerNet (the export path) for every test here: a graph compiles once per cell instance and shapes."""
    return AnswerNet(model)


def changed(batch, **updates):
    new = {k: v.copy() for k, v in batch.items()}
    for key, fn in updates.items():
        fn(new[key])
    return new


def assert_all_close(a, b, atol=1e-5):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=atol)


# ------------------------------------------------------------------------------------------ shapes

def test_model_outputs_have_documented_shapes(cfg, outputs):
    embed = cfg.model.embed_dim
    shapes = [o.shape for o in outputs]
    assert shapes == [(BATCH, cfg.model.num_answers), (BATCH, ANSWER_LEN, VOCAB), (BATCH, embed), (BATCH, embed),
                      (BATCH, embed), (BATCH, embed), (), ()]
    for emb in outputs[2:6]:
        np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(outputs[6], np.exp(cfg.model.logit_scale_init), rtol=1e-5)


def test_encoder_and_fusion_shapes(cfg, model, batch):
    image_tokens, image_pooled = run(model.vision, batch, ("image",))
    patches = (cfg.preprocess.image_size // cfg.model.vision.patch_size) ** 2
    assert image_tokens.shape == (BATCH, 1 + patches, cfg.model.vision.width)
    np.testing.assert_array_equal(image_pooled, image_tokens[:, 0])

    text_tokens, text_pooled = run(model.text, batch, ("question_ids", "question_mask"))
    assert text_tokens.shape == (BATCH, TEXT_LEN, cfg.model.text.width)
    np.testing.assert_array_equal(text_pooled, text_tokens[:, 0])

    audio_tokens, token_mask, audio_pooled = run(model.audio, batch, ("audio_mel", "audio_mask"))
    assert audio_tokens.shape == (BATCH, FRAMES // 2, cfg.model.audio.width)
    np.testing.assert_array_equal(token_mask, batch["audio_mask"][:, ::2])  # token i <-> frame 2i
    assert token_mask.sum(1).tolist() == [(n + 1) // 2 for n in FRAME_COUNTS]
    expected_pool = (audio_tokens * token_mask[..., None]).sum(1) / token_mask.sum(1, keepdims=True)
    np.testing.assert_allclose(audio_pooled, expected_pool, atol=1e-5)

    cls, states = model.fusion(Tensor(image_tokens), Tensor(text_tokens), Tensor(batch["question_mask"]),
                               Tensor(audio_tokens), Tensor(token_mask), Tensor(batch["answer_in"]))
    assert cls.shape == (BATCH, cfg.model.fusion.width)
    assert states.shape == (BATCH, ANSWER_LEN, cfg.model.fusion.width)

    # Padding is harmless: sample 0 alone, cut to its own lengths, gives the same valid tokens.
    short = {"question_ids": batch["question_ids"][:1, :9], "question_mask": batch["question_mask"][:1, :9],
             "audio_mel": batch["audio_mel"][:1, :, :122], "audio_mask": batch["audio_mask"][:1, :122]}
    alone_text, _ = run(model.text, short, ("question_ids", "question_mask"))
    np.testing.assert_allclose(alone_text[0], text_tokens[0, :9], atol=1e-5)
    alone_audio, _, alone_pooled = run(model.audio, short, ("audio_mel", "audio_mask"))
    np.testing.assert_allclose(alone_audio[0], audio_tokens[0, :61], atol=1e-5)
    np.testing.assert_allclose(alone_pooled[0], audio_pooled[0], atol=1e-5)


def test_missing_vocab_size_is_a_clear_error(cfg):
    model_cfg = load_config("tiny").model
    assert model_cfg.text.vocab_size == 0
    with pytest.raises(ValueError, match="vocab_size"):
        build_cells(model_cfg, cfg.preprocess)
    with pytest.raises(ValueError, match="vocab_size"):
        MultimodalModel(model_cfg, cfg.preprocess)


def test_parameter_names_are_stable_checkpoint_keys(model):
    names = [p.name for p in model.get_parameters()]
    assert len(names) == len(set(names))
    for key in ("vision.encoder.blocks.0.attn.q_proj.weight", "vision.patch_embed.weight", "vision.pos_embed",
                "text.word_embeddings.weight", "text.encoder.blocks.1.mlp.fc2.bias", "audio.conv2.weight",
                "audio.encoder.norm.weight", "fusion.type_embeddings.weight", "fusion.answer_embeddings.weight",
                "image_proj.fc.weight", "logit_scale_audio_text.value", "answer_head.fc.weight", "lm_head.fc.weight"):
        assert key in names, key


# ------------------------------------------------------------------------------------------ masks

def test_padded_question_tokens_and_audio_frames_change_nothing(cfg, model, answer_net, batch, outputs):
    def scramble_text(ids):
        ids[0, 9:] = 7
        ids[2, 5:] = 3

    def scramble_audio(mel):
        mel[0, :, 121:] = 5.0
        mel[2, :, 60:] = -3.0

    new = changed(batch, question_ids=scramble_text, audio_mel=scramble_audio)
    assert_all_close(run(model, packed(cfg, new)), outputs)  # training packs the valid entries only
    # deployment reads the padded arrays: there the masks make their padding harmless
    np.testing.assert_allclose(run(answer_net, new, EXPORT_INPUTS), run(answer_net, batch, EXPORT_INPUTS), atol=1e-5)
    audio_tokens, token_mask, audio_pooled = run(model.audio, batch, ("audio_mel", "audio_mask"))
    new_audio, _, new_pooled = run(model.audio, new, ("audio_mel", "audio_mask"))
    np.testing.assert_allclose(new_audio[token_mask == 1], audio_tokens[token_mask == 1], atol=1e-5)
    np.testing.assert_allclose(new_pooled, audio_pooled, atol=1e-5)

    text_tokens, _ = run(model.text, batch, ("question_ids", "question_mask"))
    new_text, _ = run(model.text, new, ("question_ids", "question_mask"))
    valid = batch["question_mask"] == 1
    np.testing.assert_allclose(new_text[valid], text_tokens[valid], atol=1e-5)


def test_later_answer_tokens_never_reach_earlier_positions_or_the_prefix(cfg, model, batch, outputs):
    def last_token(ids):
        ids[:, -1] = (ids[:, -1] + 11) % VOCAB

    new = run(model, packed(cfg, changed(batch, answer_in=last_token)))
    np.testing.assert_allclose(new[1][:, :-1], outputs[1][:, :-1], atol=1e-5)  # earlier LM positions
    np.testing.assert_allclose(new[0], outputs[0], atol=1e-5)  # CLS / answer logits
    assert np.abs(new[1][:, -1] - outputs[1][:, -1]).max() > 1e-4  # the changed position does move


def test_use_text_zero_hides_the_question_text_from_the_answer(cfg, model, batch, outputs):
    def new_question(ids):
        ids[:] = (ids + 13) % VOCAB

    new = run(model, packed(cfg, changed(batch, question_ids=new_question)))
    np.testing.assert_allclose(new[0][2], outputs[0][2], atol=1e-5)  # sample 2: use_text = 0
    np.testing.assert_allclose(new[1][2], outputs[1][2], atol=1e-5)
    assert np.abs(new[0][:2] - outputs[0][:2]).max() > 1e-4  # samples 0, 1 read their text
    assert np.abs(new[5] - outputs[5]).max() > 1e-4  # question_emb always follows the text


def test_use_audio_zero_hides_the_audio_from_the_answer(cfg, model, batch, outputs):
    def new_audio(mel):
        mel[:] = -mel

    new = run(model, packed(cfg, changed(batch, audio_mel=new_audio)))
    np.testing.assert_allclose(new[0][1], outputs[0][1], atol=1e-5)  # sample 1: use_audio = 0
    assert np.abs(new[0][[0, 2]] - outputs[0][[0, 2]]).max() > 1e-4


# ------------------------------------------------------------------------------------------ wrappers

def test_export_wrappers_match_the_training_graph(model, answer_net, batch, outputs):
    names_before = [p.name for p in model.get_parameters()]
    answer_probs = run(answer_net, batch, EXPORT_INPUTS)
    logits = outputs[0]
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(answer_probs, expected / expected.sum(-1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(run(GenerateNet(model), batch, EXPORT_INPUTS + ("answer_in",)), outputs[1],
                               atol=1e-5)
    np.testing.assert_allclose(run(ImageEmbedNet(model), batch, ("image",)), outputs[2], atol=1e-5)
    text_embed = TextEmbedNet(model)  # captions and questions: same shapes, one graph
    np.testing.assert_allclose(run(text_embed, batch, ("caption_ids", "caption_mask")), outputs[3], atol=1e-5)
    np.testing.assert_allclose(run(text_embed, batch, ("question_ids", "question_mask")), outputs[5], atol=1e-5)
    np.testing.assert_allclose(run(AudioEmbedNet(model), batch, ("audio_mel", "audio_mask")), outputs[4],
                               atol=1e-5)
    assert [p.name for p in model.get_parameters()] == names_before  # wrapping renames nothing
