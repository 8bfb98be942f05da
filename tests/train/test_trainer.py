"""A short real training run (graph mode, real easy-VQA data) and its checkpoints."""
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl.cells import create_model
from mindvl.train.checkpoint import CheckpointError, latest_checkpoint, load_model_weights


def test_short_training_on_real_data_lowers_the_loss(trained_run):
    cfg, result = trained_run
    assert result.steps == 30 and result.samples == 30 * cfg.data.batch_size
    assert result.nonfinite_steps == 0
    assert result.compile_seconds > 0 and result.samples_per_second > 0
    assert result.final_losses["loss"] < result.first_losses["loss"]
    assert result.final_losses["answer"] < result.first_losses["answer"]
    assert result.final_losses["lm"] < result.first_losses["lm"]


def test_checkpoints_are_written_at_intervals_with_a_train_state(trained_run):
    cfg, result = trained_run
    checkpoints = Path(result.output_dir) / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_00000010", "step_00000020", "step_00000030"]
    latest = latest_checkpoint(checkpoints)
    assert latest.name == "step_00000030"
    state = json.loads((latest / "train_state.json").read_text())
    assert state["step"] == 30 and state["samples"] == 30 * cfg.data.batch_size
    assert (latest / "optimizer.safetensors").is_file()
    saved = json.loads((Path(result.output_dir) / "config.json").read_text())
    assert saved["model"]["text"]["vocab_size"] == cfg.model.text.vocab_size > 0
    assert list(Path(result.output_dir, "tb").iterdir())  # TensorBoard event file


def test_weights_load_back_exactly(trained_run):
    cfg, result = trained_run
    model = create_model(cfg.model, cfg.preprocess)
    state = load_model_weights(model, Path(result.output_dir))
    assert state["step"] == 30
    from safetensors.numpy import load_file
    saved = load_file(str(Path(result.checkpoint) / "model.safetensors"))
    for name, param in model.parameters_and_names():
        np.testing.assert_array_equal(param.asnumpy(), saved[name])


def test_truncated_checkpoint_is_a_clear_error(trained_run, tmp_path):
    cfg, result = trained_run
    data = (Path(result.checkpoint) / "model.safetensors").read_bytes()
    broken = tmp_path / "model.safetensors"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model_weights(create_model(cfg.model, cfg.preprocess), broken)


def test_checkpoint_of_another_config_is_refused(trained_run):
    cfg, result = trained_run
    cfg.model.fusion.layers += 1
    try:
        with pytest.raises(CheckpointError, match="does not match the model"):
            load_model_weights(create_model(cfg.model, cfg.preprocess), Path(result.output_dir))
    finally:
        cfg.model.fusion.layers -= 1


def test_resume_continues_with_the_same_samples_and_weights(trained_run, tmp_path):
    """Resuming from step 20 of the 30-step run ends where the uninterrupted run ended."""
    import copy
    import shutil

    from safetensors.numpy import load_file

    from mindvl.train import train

    cfg, result = trained_run
    resumed_cfg = copy.deepcopy(cfg)
    resumed_cfg.train.output_dir = str(tmp_path / "run")
    start = tmp_path / "run" / "checkpoints" / "step_00000020"
    shutil.copytree(Path(result.output_dir) / "checkpoints" / "step_00000020", start)
    resumed = train(resumed_cfg, progress=False, resume=str(start))
    assert resumed.start_step == 20 and resumed.steps == 30
    final = json.loads((Path(resumed.checkpoint) / "train_state.json").read_text())
    original = json.loads((Path(result.checkpoint) / "train_state.json").read_text())
    assert final["data"] == original["data"]  # same position: epoch, batch, samples
    got = load_file(str(Path(resumed.checkpoint) / "model.safetensors"))
    want = load_file(str(Path(result.checkpoint) / "model.safetensors"))
    for name in want:  # tolerance: float32 reductions may be ordered differently across compilations
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


def test_resume_without_a_checkpoint_is_a_clear_error(trained_run, tmp_path):
    from mindvl.train.trainer import Trainer

    cfg, _ = trained_run
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        Trainer(cfg, progress=False, resume=str(tmp_path))


def test_packing_statistics_are_reported(trained_run):
    _, result = trained_run
    assert set(result.packing) == {"fusion", "text", "audio"}
    for stream in result.packing.values():
        assert 0.5 < stream["fill"] <= 1.0
        assert stream["batches"] == 30
    assert result.packing["fusion"]["samples_per_row"] > 1.0


def test_model_sizes_follow_the_data_or_fail_clearly(make_config, tmp_path):
    from mindvl.config import ConfigError
    from mindvl.train.trainer import bind_data

    cfg = make_config(tmp_path, model__num_answers=0)
    bind_data(cfg, vocab=50, answers=40)
    assert (cfg.model.text.vocab_size, cfg.model.num_answers) == (50, 40)
    with pytest.raises(ConfigError, match=r"model.num_answers: 13 does not match .* \(40 answers\); set it to 0"):
        bind_data(make_config(tmp_path), vocab=50, answers=40)
