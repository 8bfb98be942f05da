"""`mindvl average`: weighted means of real checkpoints of the small trained run, what is refused and why,
and the command end to end with its evaluation table."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mindvl.errors import CheckpointError, ConfigError
from mindvl.train.average import average_checkpoints, normalise_weights
from mindvl.files import sha256_file


def _checkpoint(result, step: int) -> Path:
    return Path(result.output_dir) / "checkpoints" / f"step_{step:08d}"


def _variant(base: Path, folder: Path, config_edit=None, weights_edit=None) -> Path:
    """A run folder holding the base run's config and step-30 weights, each edited in place."""
    folder.mkdir(parents=True)
    config = json.loads((base / "config.json").read_text())
    weights = load_file(str(base / "checkpoints" / "step_00000030" / "model.safetensors"))
    (config_edit or (lambda c: None))(config)
    (weights_edit or (lambda w: None))(weights)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def test_weighted_average_is_the_numpy_weighted_mean_and_loads(trained_run, tmp_path):
    from mindvl.model_factory import load_model

    cfg, result = trained_run
    first, second = _checkpoint(result, 10), _checkpoint(result, 30) / "model.safetensors"
    out = average_checkpoints([first, second], [1.0, 3.0], tmp_path / "soup")

    a, b = load_file(str(first / "model.safetensors")), load_file(str(second))
    soup = load_file(str(out / "model.safetensors"))
    assert set(soup) == set(a)
    for name in a:  # same order of float64 operations, so exactly equal
        want = (0.25 * a[name].astype(np.float64) + 0.75 * b[name].astype(np.float64)).astype(np.float32)
        assert soup[name].dtype == np.float32
        np.testing.assert_array_equal(soup[name], want, err_msg=name)
    assert not np.array_equal(soup["vision.pos_embed"], b["vision.pos_embed"])

    record = json.loads((out / "average.json").read_text())
    assert [item["weight"] for item in record["ingredients"]] == [0.25, 0.75]
    assert [item["sha256"] for item in record["ingredients"]] == [sha256_file(first / "model.safetensors"),
                                                                  sha256_file(second)]
    assert record["ingredients"][0]["weights_file"] == str((first / "model.safetensors").resolve())
    assert record["config"] == {"taken_from": str(first), "sections_differing": []}
    assert record["evaluation"] is None

    _, model, _ = load_model(str(out))  # what `mindvl eval --run` does
    for name, param in model.parameters_and_names():
        np.testing.assert_array_equal(param.asnumpy(), soup[name], err_msg=name)


def test_default_weights_are_uniform_over_every_kind_of_ingredient(trained_run, tmp_path):
    _, result = trained_run
    run = Path(result.output_dir)  # its latest checkpoint: step 30
    step10 = _checkpoint(result, 10)
    step20 = _checkpoint(result, 20) / "model.safetensors"
    out = average_checkpoints([run, step10, step20], None, tmp_path / "soup")
    soup = load_file(str(out / "model.safetensors"))
    parts = [load_file(str(_checkpoint(result, step) / "model.safetensors")) for step in (30, 10, 20)]
    name = "fusion.answer_positions.weight"
    want = sum(part[name].astype(np.float64) / 3 for part in parts).astype(np.float32)
    np.testing.assert_allclose(soup[name], want, rtol=0, atol=1e-7)
    assert json.loads((out / "average.json").read_text())["ingredients"][0]["weight"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("weights, count, message", [
    ([1.0], 2, r"weights: expected one per ingredient \(2\), got 1"),
    ([1.0, -0.5], 2, r"weights: expected finite values >= 0"),
    ([1.0, math.nan], 2, r"weights: expected finite values >= 0"),
    ([0.0, 0.0], 2, r"weights: expected a sum > 0"),
    (None, 1, r"at least 2 checkpoints, got 1"),
])
def test_bad_weights_are_refused_by_name(weights, count, message):
    with pytest.raises(ConfigError, match=message):
        normalise_weights(weights, count)


def test_weights_are_normalised():
    assert normalise_weights([2, 6], 2) == [0.25, 0.75]
    assert normalise_weights([0, 5], 2) == [0.0, 1.0]


def test_a_run_at_another_resolution_joins_with_its_position_table_resized(trained_run, tmp_path):
    from mindvl.engine.position_table import resize_positions

    _, result = trained_run
    base = Path(result.output_dir)
    grid_6 = {}

    def at_96_pixels(config):
        config["preprocess"]["image_size"] = 96

    def trained_at_96(weights):  # as if trained at 96x96: a 6x6 patch grid
        grid_6["table"] = weights["vision.pos_embed"] = resize_positions(weights["vision.pos_embed"], 4, 6) + 0.01

    other = _variant(base, tmp_path / "at96", at_96_pixels, trained_at_96)
    out = average_checkpoints([base, other], None, tmp_path / "soup")
    soup = load_file(str(out / "model.safetensors"))
    ours = load_file(str(base / "checkpoints" / "step_00000030" / "model.safetensors"))["vision.pos_embed"]
    want = (ours.astype(np.float64) + resize_positions(grid_6["table"], 6, 4)) / 2
    assert soup["vision.pos_embed"].shape == (1, 17, 32)
    np.testing.assert_allclose(soup["vision.pos_embed"], want, rtol=0, atol=1e-6)
    record = json.loads((out / "average.json").read_text())
    assert record["resized_position_tables"] == [{"source": str(other), "image_size": 96, "grid": [6, 4]}]
    assert json.loads((out / "config.json").read_text())["preprocess"]["image_size"] == 64


def test_missing_parameter_is_named(trained_run, tmp_path):
    _, result = trained_run
    base = Path(result.output_dir)
    other = _variant(base, tmp_path / "fewer", weights_edit=lambda w: w.pop("fusion.answer_positions.weight"))
    with pytest.raises(CheckpointError, match=r"fewer: holds other parameters than .*run.* \(missing "
                                              r"\['fusion.answer_positions.weight'\]\); only checkpoints"):
        average_checkpoints([base, other], None, tmp_path / "soup")


def test_integer_arrays_are_kept_when_equal_and_refused_when_not(trained_run, tmp_path):
    _, result = trained_run
    base = Path(result.output_dir)

    def counter(value):
        return lambda weights: weights.update({"extra.counter": np.array([value], np.int32)})

    first, same, other = (_variant(base, tmp_path / name, weights_edit=counter(value))
                          for name, value in (("a", 3), ("b", 3), ("c", 4)))
    out = average_checkpoints([first, same], [1, 2], tmp_path / "soup")
    kept = load_file(str(out / "model.safetensors"))["extra.counter"]
    assert kept.dtype == np.int32 and kept.tolist() == [3]
    with pytest.raises(CheckpointError, match=r"c: extra.counter is an integer array \(int32\) that differs"):
        average_checkpoints([first, other], None, tmp_path / "soup2")


def test_other_architecture_in_the_run_config_is_refused(trained_run, tmp_path):
    _, result = trained_run
    base = Path(result.output_dir)

    def deeper(config):
        config["model"]["fusion"]["layers"] = 2

    other = _variant(base, tmp_path / "deeper", deeper)
    with pytest.raises(CheckpointError, match=r"deeper: its run config's model section differs from .* in "
                                              r"model.fusion.layers 2 vs 1; only checkpoints of one architecture"):
        average_checkpoints([base, other], None, tmp_path / "soup")


def test_other_training_settings_are_allowed_and_the_first_ones_taken(trained_run, tmp_path):
    _, result = trained_run
    base = Path(result.output_dir)

    def elsewhere(config):
        config["train"]["lr"] = 1e-4
        config["data"]["batch_size"] = 4
        config["model"]["pretrained"]["cache"] = str(tmp_path / "cache")  # a location, not the architecture

    other = _variant(base, tmp_path / "other_lr", elsewhere)
    out = average_checkpoints([base, other], None, tmp_path / "soup")
    record = json.loads((out / "average.json").read_text())
    assert record["config"] == {"taken_from": str(base), "sections_differing": ["data", "train"]}
    assert json.loads((out / "config.json").read_text()) == json.loads((base / "config.json").read_text())


def test_an_ingredient_as_output_is_refused(trained_run, tmp_path):
    _, result = trained_run
    step30 = _checkpoint(result, 30)
    with pytest.raises(CheckpointError, match="is one of the ingredients"):
        average_checkpoints([_checkpoint(result, 20), step30], None, step30)


def test_command_writes_the_soup_and_prints_the_table(trained_run, tmp_path, capsys):
    from mindvl.cli import main

    _, result = trained_run
    first, second = str(_checkpoint(result, 20)), str(_checkpoint(result, 30))
    out = tmp_path / "soup"
    assert main(["average", first, second, "--out", str(out), "--weights", "1", "1"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "average.json").read_text())
    rows = record["evaluation"]["rows"]
    assert [row["ingredient"] for row in rows] == [first, second, "average"]
    for row in rows:
        for modality in ("text", "spoken"):
            assert row[modality]["count"] == rows[0]["text"]["count"] > 0
            assert 0 <= row[modality]["accuracy"] <= 1
    table = printed.splitlines()
    header = table.index(next(line for line in table if "text VQA" in line))
    assert table[header].split() == ["ingredient", "weight", "text", "VQA", "spoken", "VQA"]
    body = table[header + 1:header + 4]
    assert body[2].split() == ["average", "-", f"{rows[2]['text']['accuracy']:.1%}",
                               f"{rows[2]['spoken']['accuracy']:.1%}"]
    scores = [(row["text"]["accuracy"] + row["spoken"]["accuracy"]) / 2 for row in rows[:2]]
    best = scores.index(max(scores))
    assert [line.startswith("*") for line in body] == [best == 0, best == 1, False]
    assert body[best].split()[1:3] == [rows[best]["ingredient"], "0.500"]
    assert f"mindvl eval --run {out}" in printed


def test_command_names_a_bad_ingredient(trained_run, tmp_path, capsys):
    from mindvl.cli import main

    _, result = trained_run
    missing = tmp_path / "no_such_run"
    assert main(["average", str(_checkpoint(result, 30)), str(missing), "--out", str(tmp_path / "soup"),
                 "--no-eval"]) == 2
    assert f"mindvl: error: {missing}: no checkpoint found" in capsys.readouterr().err
    assert main(["average", str(_checkpoint(result, 30)), str(_checkpoint(result, 20)), "--out",
                 str(tmp_path / "soup"), "--weights", "1"]) == 2
    assert "weights: expected one per ingredient (2), got 1" in capsys.readouterr().err
