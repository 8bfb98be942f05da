"""Config loading: recipes by name and path, include + overrides, and errors that name the key."""
import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config, recipe_names


def test_tiny_recipe_loads_by_name_with_typed_sections():
    cfg = load_config("tiny")
    assert "tiny" in recipe_names()
    assert cfg.name == "tiny"
    assert cfg.model.vision.patch_size == 16
    assert isinstance(cfg.train.lr, float)


def test_include_and_override_merge(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("include: tiny\nname: mine\ntrain:\n  lr: 0.0005\n")
    cfg = load_config(str(recipe), ["train.epochs=3", "model.fusion.layers=1", "train.min_lr=1e-6"])
    assert cfg.train.min_lr == 1e-6  # YAML reads 1e-6 as a string; numerals still count as numbers
    assert cfg.name == "mine"
    assert cfg.train.lr == 0.0005
    assert cfg.train.epochs == 3
    assert cfg.model.fusion.layers == 1
    assert cfg.model.vision.width == load_config("tiny").model.vision.width  # inherited


@pytest.mark.parametrize("override, fragments", [
    ("train.lrr=1e-3", ["train.lrr", "unknown key", "'lr'"]),
    ("model.vison.width=64", ["model.vison", "unknown key", "'vision'"]),
    ("train.lr=fast", ["train.lr", "expected a number", "'fast'"]),
    ("train.epochs=1.5", ["train.epochs", "expected an integer", "1.5"]),
    ("model.fusion.activation=swish", ["model.fusion.activation", "'gelu'", "'swish'"]),
    ("model.vision.heads=5", ["model.vision.width", "heads=5"]),
    ("model.vision.patch_size=7", ["model.vision.patch_size", "image_size=64"]),
    ("data.test_voices=[en-us]", ["data.test_voices", "en-us"]),
    ("data.question_modality_mix=[0.5,0.5]", ["data.question_modality_mix", "summing to 1"]),
    ("train.lr", ["expected KEY=VALUE"]),
])
def test_bad_values_name_the_dotted_key(override, fragments):
    with pytest.raises(ConfigError) as info:
        load_config("tiny", [override])
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="tiny"):
        load_config("tinyy")


def test_broken_yaml_and_include_cycle_are_config_errors(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(broken))
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_config(str(tmp_path / "a.yaml"))
