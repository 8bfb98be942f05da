"""Checkpoints a week-long run can trust: round trips, sha256 verification, fallback, pruning, refusals."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mindvl.files import sha256_file
from mindvl.errors import CheckpointError
from mindvl.runs import best_checkpoint, CHECKPOINT_FORMAT, latest_checkpoint, load_model_weights, read_best
from mindvl.train.checkpoint import (check_same_model, find_resumable, load_optimizer_state, mark_best,
                                     save_checkpoint, verify_checkpoint)

MODEL_CONFIG = {"fusion": {"width": 128, "layers": 2}, "text": {"vocab_size": 50, "shape": (4, 8)}}


class Tiny(nn.Cell):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.weight = Parameter(Tensor(rng.normal(size=(4, 3)).astype(np.float32)), name="weight")
        self.bias = Parameter(Tensor(rng.normal(size=(3,)).astype(np.float32)), name="bias")

    def construct(self, x):
        return x @ self.weight + self.bias


def tiny(seed: int = 0):
    model = Tiny(seed)
    return model, nn.AdamWeightDecay(model.trainable_params(), learning_rate=0.1)


def save(directory: Path, step: int, **kwargs) -> Path:
    model, optimizer = tiny(step)
    return save_checkpoint(directory, step, model, optimizer, {"samples": step * 8, "model_config": MODEL_CONFIG},
                           **kwargs)


def test_round_trip_restores_weights_moments_step_and_extra_arrays(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model, optimizer = tiny(1)
    optimizer((Tensor(np.ones((4, 3), np.float32)), Tensor(np.full((3,), 0.5, np.float32))))  # real moments
    extra = {"loss_scale": np.array(1024.0, np.float32), "loss_weights": np.array([0.1, -0.3], np.float32)}
    path = save_checkpoint(tmp_path, 7, model, optimizer, {"samples": 56}, extra=extra)

    restored, restored_opt = tiny(2)
    state = load_model_weights(restored, path)
    got_extra = load_optimizer_state(restored, restored_opt, path)

    assert state["step"] == 7 and state["samples"] == 56
    for name, param in model.parameters_and_names():
        np.testing.assert_array_equal(dict(restored.parameters_and_names())[name].asnumpy(), param.asnumpy())
    for want, got in zip(list(optimizer.moments1) + list(optimizer.moments2),
                         list(restored_opt.moments1) + list(restored_opt.moments2)):
        assert np.abs(want.asnumpy()).sum() > 0
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    assert restored_opt.global_step.asnumpy()[0] == optimizer.global_step.asnumpy()[0] == 1
    assert set(got_extra) == set(extra)
    assert got_extra["loss_scale"].shape == () and got_extra["loss_scale"] == 1024.0
    np.testing.assert_array_equal(got_extra["loss_weights"], extra["loss_weights"])


def test_optimizer_state_without_extra_returns_an_empty_dict(tmp_path):
    path = save(tmp_path, 1)
    model, optimizer = tiny()
    assert load_optimizer_state(model, optimizer, path) == {}


def test_train_state_records_format_version_and_sha256_of_each_file(tmp_path):
    path = save(tmp_path, 3)
    state = json.loads((path / "train_state.json").read_text())
    assert state["format"] == CHECKPOINT_FORMAT == 2
    assert state["mindvl_version"] == __import__("mindvl").__version__
    assert set(state["files"]) == {"model.safetensors", "optimizer.safetensors"}
    for name, digest in state["files"].items():
        assert digest == hashlib.sha256((path / name).read_bytes()).hexdigest() == sha256_file(path / name)
    assert verify_checkpoint(path) == state
    assert latest_checkpoint(tmp_path) == path
    assert not list(tmp_path.glob(".tmp_*"))


def test_truncated_model_file_is_detected_with_the_file_named(tmp_path):
    path = save(tmp_path, 1)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated or corrupt: sha256 [0-9a-f]{64} "
                                              r"!= recorded [0-9a-f]{64}"):
        verify_checkpoint(path)


def test_a_flipped_byte_is_detected(tmp_path):
    path = save(tmp_path, 1)
    weights = path / "optimizer.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # inside the tensor data: safetensors itself would load it silently
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors: truncated or corrupt"):
        verify_checkpoint(path)


@pytest.mark.parametrize("damage, message", [
    (lambda path: (path / "optimizer.safetensors").unlink(), r"optimizer\.safetensors: missing"),
    (lambda path: (path / "train_state.json").unlink(), r"train_state\.json: missing"),
    (lambda path: (path / "train_state.json").write_text('{"step": 1, "form'), r"train_state\.json: unparsable"),
])
def test_missing_or_unparsable_files_are_named(tmp_path, damage, message):
    path = save(tmp_path, 1)
    damage(path)
    with pytest.raises(CheckpointError, match=message) as info:
        verify_checkpoint(path)
    assert "resume from an earlier checkpoint" in str(info.value)


@pytest.mark.parametrize("fmt, shown", [(1, "format 1;"), (None, "format 1 (none recorded)"), (3, "format 3;")])
def test_another_checkpoint_format_is_refused_with_both_versions(tmp_path, fmt, shown):
    path = save(tmp_path, 1)
    state = json.loads((path / "train_state.json").read_text())
    state.pop("format")
    state.pop("mindvl_version")  # as a format-1 checkpoint, which recorded neither
    if fmt is not None:
        state["format"] = fmt
        state["mindvl_version"] = "0.0.9"
    (path / "train_state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(path)
    message = str(info.value)
    assert shown in message and "reads format 2" in message and "start a fresh run" in message
    assert ("written by mindvl 0.0.9" if fmt else "written by mindvl an unrecorded version") in message


def test_find_resumable_falls_back_to_the_previous_good_checkpoint_and_warns(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    newest = tmp_path / "step_00000003" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:40])
    warnings = []
    assert find_resumable(tmp_path, warnings.append) == tmp_path / "step_00000002"
    assert len(warnings) == 1
    assert "step_00000003/model.safetensors: truncated or corrupt" in warnings[0]
    assert "falling back to the previous good checkpoint step_00000002" in warnings[0]


def test_find_resumable_goes_by_step_number_not_the_latest_pointer(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / "latest").write_text("step_00000001")  # a crash between the rename and the pointer update
    warnings = []
    assert find_resumable(tmp_path, warnings.append) == tmp_path / "step_00000002"
    assert warnings == []


def test_find_resumable_without_checkpoints_is_none(tmp_path):
    assert find_resumable(tmp_path / "absent", print) is None
    (tmp_path / ".tmp_step_00000001_1").mkdir()  # an interrupted write is not a checkpoint
    assert find_resumable(tmp_path, print) is None


def test_find_resumable_lists_every_problem_when_all_fail(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / "step_00000001" / "train_state.json").unlink()
    (tmp_path / "step_00000002" / "optimizer.safetensors").write_bytes(b"")
    warnings = []
    with pytest.raises(CheckpointError) as info:
        find_resumable(tmp_path, warnings.append)
    message = str(info.value)
    assert "no usable checkpoint" in message
    assert "step_00000001/train_state.json: missing" in message
    assert "step_00000002/optimizer.safetensors: truncated or corrupt" in message
    assert warnings == []


def test_keep_prunes_older_checkpoints_but_never_the_best(tmp_path):
    first = save(tmp_path, 1, keep=2)
    mark_best(tmp_path, first, "val/accuracy", 0.75)
    for step in (2, 3, 4, 5):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000001", "step_00000004", "step_00000005"]
    assert best_checkpoint(tmp_path) == first
    assert read_best(tmp_path) == {"checkpoint": "step_00000001", "metric": "val/accuracy", "value": 0.75, "step": 1}
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000005"
    assert not list(tmp_path.glob(".tmp_*"))


def test_keep_zero_keeps_everything_and_best_moves(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    mark_best(tmp_path, tmp_path / "step_00000002", "val/loss", 1.5)
    mark_best(tmp_path, tmp_path / "step_00000003", "val/loss", 1.25)
    assert len(list(tmp_path.glob("step_*"))) == 3
    assert best_checkpoint(tmp_path) == tmp_path / "step_00000003"
    with pytest.raises(CheckpointError, match=r"step_00000009/train_state\.json: missing"):
        mark_best(tmp_path, tmp_path / "step_00000009", "val/loss", 1.0)


def test_unreadable_best_pointer_is_a_clear_error(tmp_path):
    (tmp_path / "best").write_text("step_00000001")  # not JSON
    with pytest.raises(CheckpointError, match="unreadable best-checkpoint pointer; delete it"):
        best_checkpoint(tmp_path)


def test_stale_temporary_folders_of_a_killed_writer_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in (f".tmp_step_00000002_{dead}", f".tmp_step_00000003_{os.getpid()}",
                     f".tmp_step_00000004_{live.pid}"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "model.safetensors").write_bytes(b"partial")
        (tmp_path / f".tmp_latest_{dead}").write_text("step_00000002")
        save(tmp_path, 5)
        leftovers = sorted(p.name for p in tmp_path.glob(".tmp_*"))
    finally:
        live.kill()
        live.wait()
    assert leftovers == [f".tmp_step_00000004_{live.pid}"]  # a live writer's folder is not touched
    assert verify_checkpoint(tmp_path / "step_00000005")["step"] == 5


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    save(tmp_path, 4)
    model, optimizer = tiny(99)
    path = save_checkpoint(tmp_path, 4, model, optimizer, {"samples": 1})
    assert verify_checkpoint(path)["samples"] == 1
    restored, _ = tiny(0)
    load_model_weights(restored, path)
    np.testing.assert_array_equal(restored.weight.asnumpy(), model.weight.asnumpy())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_check_same_model_names_the_differing_keys(tmp_path):
    path = save(tmp_path, 1)
    state = verify_checkpoint(path)
    check_same_model(path, state, MODEL_CONFIG)  # tuples saved as JSON lists still compare equal
    wider = {**MODEL_CONFIG, "fusion": {"width": 256, "layers": 2}, "audio": {"bins": 80}}
    with pytest.raises(CheckpointError) as info:
        check_same_model(path, state, wider)
    message = str(info.value)
    assert "holds a run of another model" in message
    assert "model.fusion.width is 128 there, 256 here" in message
    assert "model.audio.bins is 'absent' there, 80 here" in message
    assert "model.fusion.layers" not in message and "pick another train.output_dir" in message


def test_check_same_model_lists_at_most_five_keys(tmp_path):
    there = {f"k{i}": i for i in range(1, 9)}
    with pytest.raises(CheckpointError, match=r"k5 is 5 there, -5 here; and 3 more;") as info:
        check_same_model(tmp_path, {"model_config": there}, {key: -value for key, value in there.items()})
    assert "model.k6" not in str(info.value)


def test_check_same_model_refuses_a_state_without_model_config(tmp_path):
    with pytest.raises(CheckpointError, match="records no model config: written by mindvl 0.0.9 with "
                                              "checkpoint format 1"):
        check_same_model(tmp_path, {"step": 3, "mindvl_version": "0.0.9", "format": 1}, MODEL_CONFIG)
