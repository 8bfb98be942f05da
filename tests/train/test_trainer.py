"""A short real training run (graph mode, real easy-VQA data) and its checkpoints."""
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl.cells import build_cells
from mindvl.errors import CheckpointError
from mindvl.runs import latest_checkpoint, load_model_weights


def test_short_training_on_real_data_lowers_the_loss(trained_run):
    cfg, result = trained_run
    assert result.steps == 30 and result.samples == 30 * cfg.data.batch_size
    assert result.skipped_steps == 0
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
    model = build_cells(cfg.model, cfg.preprocess)
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
        load_model_weights(build_cells(cfg.model, cfg.preprocess), broken)


def test_checkpoint_of_another_config_is_refused(trained_run):
    cfg, result = trained_run
    cfg.model.fusion.layers += 1
    try:
        with pytest.raises(CheckpointError, match="does not match the model"):
            load_model_weights(build_cells(cfg.model, cfg.preprocess), Path(result.output_dir))
    finally:
        cfg.model.fusion.layers -= 1


def test_resume_without_a_checkpoint_is_a_clear_error(trained_run, tmp_path):
    from mindvl.train import Trainer, TrainingArguments, create_model

    cfg, _ = trained_run
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        Trainer(create_model(cfg), TrainingArguments(cfg, resume=str(tmp_path), progress=False))


def test_packing_statistics_are_reported(trained_run):
    _, result = trained_run
    assert set(result.packing) == {"fusion", "text", "audio"}
    for stream in result.packing.values():
        assert 0.5 < stream["fill"] <= 1.0
        assert stream["batches"] == 30
    assert result.packing["fusion"]["samples_per_row"] > 1.0


def test_model_sizes_follow_the_data_or_fail_clearly(make_config, tmp_path):
    from mindvl.errors import ConfigError
    from mindvl.model_factory import bind_data

    cfg = make_config(tmp_path, model__num_answers=0)
    bind_data(cfg, vocab=50, answers=40)
    assert (cfg.model.text.vocab_size, cfg.model.num_answers) == (50, 40)
    with pytest.raises(ConfigError, match=r"model.num_answers: 13 does not match .* \(40 answers\); set it to 0"):
        bind_data(make_config(tmp_path), vocab=50, answers=40)


def _events(run: Path):
    """(tag, step, value) of every scalar in the run's TensorBoard event files (TFRecord framing:
    length u64, its crc u32, the Event proto, its crc u32)."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars = []
    for path in sorted((run / "tb").glob("events.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            scalars += [(value.tag, event.step, value.simple_value) for value in event.summary.value]
    return scalars


def test_metrics_go_to_jsonl_and_tensorboard(trained_run):
    _, result = trained_run
    run = Path(result.output_dir)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    for record in train:
        assert set(record["grad_norm"]) == {"vision", "text", "audio", "fusion", "heads"}
        assert all(np.isfinite(v) and v > 0 for v in record["grad_norm"].values())
        assert record["lr"] > 0 and record["samples_per_second"] >= 0 and record["loss_scale"] == 1.0
    assert train[0]["lr"] > train[-1]["lr"]  # the cosine schedule decays
    validation = [r for r in records if r.get("split") == "validation"]
    assert [r["step"] for r in validation] == [10, 20, 30]
    tags = {tag for tag, _, _ in _events(run)}
    for tag in ("train/loss", "train/lr", "train/samples_per_second", "train/loss_scale", "grad_norm/fusion",
                "val/vqa_text", "val/vqa_audio"):
        assert tag in tags, tag


def test_validation_during_training_tracks_the_best_checkpoint(trained_run):
    from mindvl.runs import best_checkpoint, read_best

    _, result = trained_run
    assert [v["step"] for v in result.validation] == [10, 20, 30]
    for metrics in result.validation:
        assert 0 <= metrics["vqa_text"] <= 1 and 0 <= metrics["vqa_audio"] <= 1
    best = max(result.validation, key=lambda v: v["val_vqa"])  # the first of equals is kept
    checkpoints = Path(result.output_dir) / "checkpoints"
    assert read_best(checkpoints)["value"] == best["val_vqa"] == result.best["value"]
    assert best_checkpoint(checkpoints).name == f"step_{best['step']:08d}"


def _copy_checkpoints(result, run: Path, *steps):
    import shutil

    for step in steps:
        name = f"step_{step:08d}"
        shutil.copytree(Path(result.output_dir) / "checkpoints" / name, run / "checkpoints" / name)
    return run / "checkpoints"


def _trainer(cfg, run: Path, resume="auto", **changes):
    import copy

    from mindvl.train import Trainer, TrainingArguments
    from mindvl.train import create_model as build

    cfg = copy.deepcopy(cfg)
    cfg.train.output_dir = str(run)
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section) if section != "fusion" else cfg.model.fusion, name, value)
    return Trainer(build(cfg), TrainingArguments(cfg, resume=resume, progress=False))


def test_resume_auto_falls_back_past_a_truncated_checkpoint(trained_run, tmp_path, caplog):
    cfg, result = trained_run
    checkpoints = _copy_checkpoints(result, tmp_path, 10, 20)
    weights = checkpoints / "step_00000020" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a write cut short
    trainer = _trainer(cfg, tmp_path)
    assert trainer.start_step == 10
    assert "step_00000020" in caplog.text and "falling back" in caplog.text


def test_resume_from_another_model_or_format_is_refused(trained_run, tmp_path):
    cfg, result = trained_run
    checkpoints = _copy_checkpoints(result, tmp_path, 20)
    with pytest.raises(CheckpointError, match="another model: model.fusion.width"):
        _trainer(cfg, tmp_path, fusion__width=64)
    state_file = checkpoints / "step_00000020" / "train_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "format": 1}))
    with pytest.raises(CheckpointError, match="checkpoint format 1"):
        _trainer(cfg, tmp_path, resume=str(checkpoints / "step_00000020"))


def test_a_batch_that_does_not_split_into_micro_batches_is_refused(trained_run, tmp_path):
    from mindvl.errors import ConfigError

    cfg, _ = trained_run
    with pytest.raises(ConfigError, match="data.batch_size: 8 .* train.grad_accumulation=3"):
        _trainer(cfg, tmp_path, resume=None, train__grad_accumulation=3)


def test_rolling_back_inside_the_run_folder_is_refused_while_newer_checkpoints_remain(trained_run, tmp_path):
    cfg, result = trained_run
    checkpoints = _copy_checkpoints(result, tmp_path, 10, 20)
    with pytest.raises(CheckpointError, match="also holds the newer step_00000020"):
        _trainer(cfg, tmp_path, resume=str(checkpoints / "step_00000010"))
    elsewhere = _trainer(cfg, tmp_path / "other", resume=str(checkpoints / "step_00000010"))
    assert elsewhere.start_step == 10
