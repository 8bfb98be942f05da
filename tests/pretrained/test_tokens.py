"""Training from the frozen encoders' cached states (model.pretrained.cache): each encoder runs once per
distinct input, the cached states are what the encoders compute, a batch of them gives the loss the full
model gives, and a damaged or vanished entry is recomputed or named, never read as something else."""
import numpy as np
import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config
from mindvl.pretrained.tokens import EncoderTokens, MissingTokens, token_cache


@pytest.fixture
def trainer(pretrained_trainer):
    """The session's pretrained-s Trainer (tests/conftest.py): building it filled the token cache."""
    return pretrained_trainer


def _inputs(trainer):
    from mindvl.data.reading.loader import split_inputs

    return split_inputs(trainer.cfg, "train")


def test_the_cache_is_refused_where_the_encoders_outputs_would_change():
    cfg = load_config("pretrained-s", ["model.pretrained.text=''", "model.audio.lora_rank=4",
                                       "model.pretrained.freeze=false", "data.augment.enabled=true"])
    with pytest.raises(ConfigError) as error:
        token_cache(cfg, model=None)
    message = str(error.value)
    for part in ("model.pretrained.text is empty", "model.pretrained.freeze is false", "model.audio.lora_rank is 4",
                 "data.augment.enabled is true", "model.pretrained.cache: ''"):
        assert part in message
    assert token_cache(load_config("pretrained-s", ["model.pretrained.cache=''"]), model=None) is None


def test_a_native_recipe_caches_only_its_audio_encoders_states():
    from mindvl.pretrained.tokens import encoder_kinds

    assert encoder_kinds(load_config("vlm-s-native").model) == ("audio",)  # its tower runs at every step
    assert encoder_kinds(load_config("vlm-s-native", ["model.native.audio=false"]).model) == ()
    with pytest.raises(ConfigError, match="reads images only has no encoder whose states are cached"):
        token_cache(load_config("vlm-s-native", ["model.native.audio=false"]), model=None)
    with pytest.raises(ConfigError, match="model.native.audio: only a dinov2 tower's recipe hears"):
        load_config("qwen-vl-lora", ["model.native.audio=true"])


def test_each_encoder_ran_once_per_distinct_input_and_a_second_run_only_reads(trainer):
    images, texts, clips = _inputs(trainer)
    assert len(images) == len(set(images)) == 8 and len(clips) == len(set(clips)) > 0
    stats = trainer.tokens.stats
    assert (stats["vision"].computed, stats["text"].computed, stats["audio"].computed) == (
        len(images), len({t[0][t[1] > 0].tobytes() for t in texts}), len(clips))
    again = EncoderTokens(trainer.tokens.root, trainer.model, trainer.cfg.preprocess)
    again.fill(trainer.model, images, texts, clips)
    assert all(s.computed == 0 and s.hits > 0 for s in again.stats.values())
    assert trainer.stream.columns[-5:] == ("pack_index", "pack_segment", "pack_answer", "cls_index", "answer_index")


def test_cached_states_are_the_encoders_outputs(trainer):
    from mindspore import Tensor

    from mindvl import preprocess as P

    images, texts, clips = _inputs(trainer)
    pre, model, tokens = trainer.cfg.preprocess, trainer.model, trainer.tokens
    want = model.vision(Tensor(P.decode_image(images[0], pre)[None]))[0].asnumpy()[0]
    got = tokens.image(images[0])
    assert got.shape == want.shape == (1 + 8 * 8, 384)
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()  # float16 storage
    ids, mask = texts[0]
    want = model.text(Tensor(ids[None]), Tensor(mask[None]))[0].asnumpy()[0] * mask[:, None]
    got = tokens.text(ids, mask)
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max() and not got[mask == 0].any()
    from mindvl.data.records import from_pcm16

    mel, frames = P.speech_features(from_pcm16(clips[0]), pre)
    states, token_mask, _ = model.audio(Tensor(mel[None]), Tensor(frames[None]))
    want = states.asnumpy()[0] * token_mask.asnumpy()[0][:, None]
    got = tokens.clip(clips[0])
    assert got.shape == (pre.max_audio_frames // 2, 512)
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


def test_a_batch_of_cached_states_gives_the_full_models_loss(trainer):
    """The first training batch through TokenInputModel and through the full model (encoders run)."""
    from mindvl.data.reading.stream import TrainStream
    from mindvl.train.losses import MultimodalLoss

    cached_ids, cached = next(iter(trainer.stream))
    full_ids, full = next(iter(TrainStream(trainer.cfg)))
    np.testing.assert_array_equal(cached_ids, full_ids)
    cached_loss, cached_parts = trainer.loss_net(*cached)
    full_loss, full_parts = MultimodalLoss(trainer.model, trainer.cfg.train.loss_weights)(*full)
    np.testing.assert_allclose(cached_parts.asnumpy(), full_parts.asnumpy(), rtol=2e-3)
    assert cached_loss.asnumpy() == pytest.approx(full_loss.asnumpy(), rel=2e-3)


def test_a_damaged_entry_is_recomputed_and_a_vanished_one_is_named(trainer):
    images, texts, clips = _inputs(trainer)
    tokens = trainer.tokens
    vision = tokens.caches["vision"]
    damaged = vision._path(vision.key(images[1]))
    damaged.write_bytes(damaged.read_bytes()[:40])  # a truncated .npy
    again = EncoderTokens(tokens.root, trainer.model, trainer.cfg.preprocess)
    again.fill(trainer.model, images, texts, clips)
    assert (again.stats["vision"].damaged, again.stats["vision"].computed) == (1, 1)
    assert tokens.image(images[1]).shape == (65, 384)
    vision._path(vision.key(images[2])).unlink()
    with pytest.raises(MissingTokens, match="no cached vision states for train sample 7 image .* restart the run"):
        tokens.image(images[2], "train sample 7 image")


def test_the_states_are_keyed_by_the_weights_the_encoders_hold(trainer):
    from mindspore import Tensor

    model, pre = trainer.model, trainer.cfg.preprocess
    before = {kind: cache.folder for kind, cache in EncoderTokens(trainer.tokens.root, model, pre).caches.items()}
    param = dict(model.vision.parameters_and_names())["encoder.norm.bias"]
    value = param.asnumpy()
    param.set_data(Tensor(value + 1e-3))  # another checkpoint's vision encoder
    try:
        after = {kind: cache.folder for kind, cache in EncoderTokens(trainer.tokens.root, model, pre).caches.items()}
    finally:
        param.set_data(Tensor(value))
    assert after["vision"] != before["vision"] and (after["text"], after["audio"]) == (before["text"], before["audio"])
    assert before == {kind: cache.folder for kind, cache in trainer.tokens.caches.items()}


def test_the_generative_model_trains_from_the_cached_states_of_its_two_encoders(small_cfg, small_report, converted,
                                                                              tmp_path):
    """A generative recipe with converted DINOv2 and Whisper frozen (a small decoder over the data's tokenizer):
    the cache holds the two encoders' states over the conversation tables' images and clips, a cached batch
    gives the loss the full model gives on the same conversations, and training steps run from it."""
    from mindvl.data.reading.conversation_loader import ConversationStream, conversation_inputs
    from mindvl.train import Trainer, TrainingArguments, create_model
    from mindvl.train.losses import GenerativeLoss

    cfg = load_config("vlm-tiny", [
        f"data.root={small_cfg.data.root}", f"train.output_dir={tmp_path / 'run'}",
        f"model.pretrained.cache={tmp_path / 'cache'}", "train.init_from=''", f"model.pretrained.vision={converted('dinov2')}",
        f"model.pretrained.audio={converted('whisper-base')}", "model.pretrained.freeze=true",
        "model.vision.patch_size=14", "preprocess.image_size=56", "preprocess.image_mean=[0.485, 0.456, 0.406]",
        "preprocess.image_std=[0.229, 0.224, 0.225]", "preprocess.hop_length=160", "preprocess.n_mels=80",
        "preprocess.max_audio_frames=256", "data.augment.enabled=false", "data.batch_size=8", "data.num_workers=1",
        "model.decoder.width=64", "train.kernels=fused", "train.max_steps=2", "train.warmup_steps=1",
        "train.checkpoint_every=2"])
    trainer = Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))
    assert set(trainer.tokens.caches) == {"vision", "audio"}  # no text encoder: the decoder reads the text
    images, texts, clips = conversation_inputs(cfg, "train")
    assert texts == [] and len(images) == len(set(images)) == 8 and len(clips) == len(set(clips)) > 0
    stats = trainer.tokens.stats
    assert (stats["vision"].computed, stats["audio"].computed) == (len(images), len(clips))

    cached_ids, cached = next(iter(trainer.stream))
    full_ids, full = next(iter(ConversationStream(cfg, trainer.model.image_tokens, trainer.model.audio_tokens)))
    np.testing.assert_array_equal(cached_ids, full_ids)
    assert cached[-3].shape == (8, 1 + 4 * 4, 384) and cached[-2].shape == (8, 128, 512)  # states, not pixels/mels
    cached_loss, _ = trainer.loss_net(*cached)
    full_loss, _ = GenerativeLoss(trainer.model)(*full)
    assert cached_loss.asnumpy() == pytest.approx(full_loss.asnumpy(), rel=2e-3)
    result = trainer.train()
    assert result.steps == 2 and np.isfinite(result.final_losses["lm"])
