"""The pretrained-s recipe: converted DINOv2, MiniLM and Whisper encoders loaded into the model, frozen
(or adapted through LoRA only), under a fusion trained on real data; and its config checks."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from mindvl.errors import ConfigError
from mindvl.config import load_config
from mindvl.pretrained.bind import bind_pretrained

from conftest import pretrained_config  # noqa: E402  (tests/conftest.py)


def _trainable(model):
    """Names (paths in the model) of the parameters the optimizer updates."""
    return {name for name, param in model.parameters_and_names() if param.requires_grad}


def _train(converted, pretrained_data, tmp_path, *extra):
    from mindvl.train import Trainer, TrainingArguments, create_model

    cfg = pretrained_config(pretrained_data, tmp_path / "run", converted, *extra)
    trainer = Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))
    return trainer, trainer.train()


def test_frozen_encoders_keep_their_converted_weights_while_the_rest_trains(converted, pretrained_data,
                                                                             pretrained_trainer, tmp_path):
    cache = pretrained_trainer.cfg.model.pretrained.cache  # the same encoders' states of the same data
    trainer, result = _train(converted, pretrained_data, tmp_path, f"model.pretrained.cache={cache}")
    trainable = _trainable(trainer.model)
    assert not any(name.startswith(("vision.", "text.", "audio.")) for name in trainable)
    assert any(name.startswith("fusion.") for name in trainable)
    assert np.isfinite(result.final_losses["loss"]) and result.skipped_steps == 0
    saved = load_file(f"{result.checkpoint}/model.safetensors")
    dinov2 = load_file(str(converted("dinov2") / "model.safetensors"))
    whisper = load_file(str(converted("whisper-base") / "model.safetensors"))
    for name in ("encoder.blocks.11.mlp.fc2.weight", "patch_embed.weight", "encoder.norm.bias"):
        np.testing.assert_array_equal(saved[f"vision.{name}"], dinov2[name])
    for name in ("conv1.weight", "encoder.blocks.5.attn.q_proj.weight"):
        np.testing.assert_array_equal(saved[f"audio.{name}"], whisper[name])
    minilm = load_file(str(converted("minilm") / "model.safetensors"))
    np.testing.assert_array_equal(saved["text.encoder.blocks.3.mlp.fc1.weight"], minilm["encoder.blocks.3.mlp.fc1.weight"])
    words = minilm["word_embeddings.weight"]  # the data's [BOS]/[EOS] rows come after the encoder's 30522
    assert saved["text.word_embeddings.weight"].shape == (30524, 384)
    np.testing.assert_array_equal(saved["text.word_embeddings.weight"][:30522], words)
    assert saved["vision.pos_embed"].shape == (1, 1 + 8 * 8, 384)  # resized from 37 x 37 to 112 / 14
    from mindvl.model_factory import load_model

    cfg, model, _ = load_model(result.output_dir)  # the run's config holds the shapes: no folder needed
    assert (cfg.model.vision.width, cfg.model.text.width, cfg.model.audio.width) == (384, 384, 512)
    np.testing.assert_array_equal(model.vision.patch_embed.weight.asnumpy(), dinov2["patch_embed.weight"])


def test_lora_adapters_are_the_only_encoder_weights_that_train(converted, pretrained_data, tmp_path):
    trainer, result = _train(converted, pretrained_data, tmp_path, "model.vision.lora_rank=2", "model.pretrained.cache=''")
    encoder_trainable = sorted(name for name in _trainable(trainer.model) if name.startswith("vision."))
    assert encoder_trainable and all(".lora_" in name for name in encoder_trainable)
    saved = load_file(f"{result.checkpoint}/model.safetensors")
    assert np.abs(saved["vision.encoder.blocks.0.attn.q_proj.lora_b"]).max() > 0  # it moved from zero
    dinov2 = load_file(str(converted("dinov2") / "model.safetensors"))
    np.testing.assert_array_equal(saved["vision.encoder.blocks.0.attn.q_proj.weight"],
                                  dinov2["encoder.blocks.0.attn.q_proj.weight"])


def test_the_recipe_checks_its_preprocess_against_the_encoders(converted):
    vision, audio = converted("dinov2"), converted("whisper-base")
    with pytest.raises(ConfigError, match="patch_size: 14 does not divide preprocess.image_size=100"):
        load_config("pretrained-s", ["preprocess.image_size=100"])
    for override, message in (("preprocess.image_mean=[0.5, 0.5, 0.5]", "set preprocess.image_mean: \\[0.485"),
                              ("preprocess.hop_length=320", "set preprocess.hop_length: 160")):
        cfg = load_config("pretrained-s", [f"model.pretrained.vision={vision}", f"model.pretrained.audio={audio}",
                                           "model.pretrained.text=''", override])
        with pytest.raises(ConfigError, match=message):
            bind_pretrained(cfg)
    swapped = load_config("pretrained-s", [f"model.pretrained.vision={audio}"])
    with pytest.raises(ConfigError, match="is a converted audio encoder, not a vision one"):
        bind_pretrained(swapped)
    with pytest.raises(ConfigError, match="mindvl convert dinov2 --out"):
        bind_pretrained(load_config("pretrained-s", ["model.pretrained.vision=/nonexistent/dinov2"]))


def test_a_pretrained_text_encoder_needs_the_data_tokenised_with_its_tokenizer(converted, small_cfg, small_report):
    cfg = load_config("pretrained-s", [f"data.root={small_cfg.data.root}", "model.pretrained.vision=''",
                                       "model.pretrained.audio=''", f"model.pretrained.text={converted('minilm')}"])
    with pytest.raises(ConfigError, match="data.tokenizer: the data in .* was not tokenised with"):
        bind_pretrained(cfg)
