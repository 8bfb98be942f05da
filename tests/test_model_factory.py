"""create_model of a generative recipe: the recipe bound from converted folders (the published DINOv2 and
Whisper base, a converted decoder), their weights loaded and frozen, projectors and LoRA adapters the only
trainable weights; clear refusals."""
import numpy as np
import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config


def _recipe(converted, decoder, root, *extra):
    return load_config("tiny", [f"data.root={root}",
        "preprocess.image_size=56", "preprocess.image_mean=[0.485, 0.456, 0.406]",
        "preprocess.image_std=[0.229, 0.224, 0.225]", "preprocess.hop_length=160", "preprocess.n_mels=80",
        "preprocess.max_audio_frames=64", "model.vision.patch_size=14",
        f"model.pretrained.vision={converted('dinov2')}", f"model.pretrained.audio={converted('whisper-base')}",
        f"model.pretrained.decoder={decoder}", "model.decoder.lora_rank=4", "model.projector.audio_tokens=8",
        "model.chat_template=plain",
        *extra])


def test_a_generative_recipe_holds_every_converted_weight_and_trains_only_projectors_and_lora(converted, tiny_llms,
                                                                                               small_cfg, small_report):
    from mindvl.model_factory import create_model
    from mindvl.pretrained.llm import read_llm_config
    from safetensors.numpy import load_file

    folder = tiny_llms["gemma3_text"]
    cfg = _recipe(converted, folder, small_cfg.data.root)
    model = create_model(cfg)
    _, decoder = read_llm_config(folder)
    assert cfg.model.decoder.width == decoder.width and cfg.model.decoder.layers == decoder.layers
    assert cfg.model.decoder.lora_rank == 4  # the recipe's LoRA kept over the folder's config
    assert model.image_tokens == 16 and model.audio_tokens == 8  # 4 x 4 patches at 56 px; 32 tokens in runs of 4
    stored = load_file(str(folder / "model.safetensors"))
    params = dict(model.decoder.parameters_and_names())
    for name, value in stored.items():
        np.testing.assert_array_equal(params[name].asnumpy(), value)
    trainable = {p.name for p in model.trainable_params()}
    assert trainable and all(n.startswith(("image_proj.", "audio_proj.")) or ".lora_" in n for n in trainable)
    assert any(".lora_" in n for n in trainable) and any(n.startswith("image_proj.") for n in trainable)


def test_generative_recipes_refuse_what_cannot_work(converted, tiny_llms, tmp_path, small_cfg, small_report):
    from mindvl.model_factory import create_model

    root = small_cfg.data.root
    with pytest.raises(ConfigError, match="model.pretrained.decoder: .* does not exist; create it with `mindvl convert llm"):
        create_model(_recipe(converted, tmp_path / "missing", root))
    with pytest.raises(ConfigError, match="model.pretrained.text: a generative model reads the text with its decoder"):
        _recipe(converted, tiny_llms["llama"], root, "model.pretrained.text=somewhere")
