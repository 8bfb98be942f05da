"""SIGKILL a real `mindvl train` process at two points and resume it each time, with --resume auto after
the first kill and from the step-20 checkpoint folder after the second, and it ends with the weights and
data position of the uninterrupted run (the session's trained_run, same config and samples)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

TOLERANCE = 1e-6  # float32 sums may be ordered differently between compilations; measured: exactly equal


def _start(config: Path, run: Path, resume: str = "") -> subprocess.Popen:
    command = [sys.executable, "-m", "mindvl.cli", "train", "--config", str(config), "--set",
               f"train.output_dir={run}", *(["--resume", resume] if resume else [])]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "GLOG_v": "3"})


def _wait_for(process: subprocess.Popen, ready, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise AssertionError(f"training ended before {what}:\n{process.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _logged_step(run: Path, step: int) -> bool:
    path = run / "metrics.jsonl"
    return path.is_file() and any(json.loads(line).get("step") == step for line in path.read_text().splitlines()
                                  if line.endswith("}"))


def _assert_same_end(checkpoint: Path, reference: Path) -> None:
    """`checkpoint` holds the tensors, data position and best validation of the uninterrupted `reference`."""
    got = load_file(str(checkpoint / "model.safetensors"))
    want = load_file(str(reference / "model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=TOLERANCE, err_msg=name)
    final, expected = (json.loads((folder / "train_state.json").read_text()) for folder in (checkpoint, reference))
    assert final["data"] == expected["data"] and final["best"] == expected["best"]


@pytest.mark.slow
def test_training_killed_twice_and_resumed_ends_with_the_uninterrupted_weights(trained_run, tmp_path):
    cfg, reference = trained_run
    config = Path(reference.output_dir) / "config.json"  # JSON is YAML: the very config of the reference
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"

    first = _start(config, run)  # killed between checkpoints: steps 11..15 are lost
    _wait_for(first, lambda: _logged_step(run, 15), "step 15")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (checkpoints / "latest").read_text() == "step_00000010"

    second = _start(config, run, resume="auto")  # killed as soon as the step-20 checkpoint is in place
    _wait_for(second, lambda: (checkpoints / "latest").is_file()
              and (checkpoints / "latest").read_text() == "step_00000020", "the step-20 checkpoint")
    second.send_signal(signal.SIGKILL)
    second.wait()

    third = _start(config, run, resume=str(checkpoints / "step_00000020"))
    output, _ = third.communicate(timeout=300)
    assert third.returncode == 0, output[-3000:]
    result = json.loads((run / "train_result.json").read_text())
    assert result["start_step"] == 20 and result["steps"] == 30

    _assert_same_end(checkpoints / "step_00000030", Path(reference.checkpoint))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [5, 10, 15, 20, 25, 30]  # each step logged once despite the repeated 11..15


@pytest.mark.slow
def test_a_generative_run_killed_and_resumed_ends_with_the_uninterrupted_weights(generative_run, tmp_path):
    """vlm-tiny (stage 2, from the session's tiny run) SIGKILLed between checkpoints and resumed with --resume
    auto: the stored tensors (everything that trains, the frozen vision encoder too) and the data position
    are the uninterrupted run's."""
    _, reference = generative_run
    config = Path(reference.output_dir) / "config.json"
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"

    first = _start(config, run)
    _wait_for(first, lambda: _logged_step(run, 15), "step 15")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (checkpoints / "latest").read_text() == "step_00000010"

    second = _start(config, run, resume="auto")
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output[-3000:]
    assert json.loads((run / "train_result.json").read_text())["start_step"] == 10
    _assert_same_end(checkpoints / "step_00000030", Path(reference.checkpoint))
