"""Checkpoints: safetensors weights + optimizer state + a train-state JSON, written atomically.

Layout: `<dir>/step_00000500/{model.safetensors, optimizer.safetensors, train_state.json}` and
`<dir>/latest` naming the newest complete one. Each checkpoint is written into a temporary folder
and renamed into place, and `latest` is replaced atomically, so a crash mid-write never leaves a
checkpoint that looks complete. The train state lives in JSON, never in a file name.
"""
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
from mindspore import Tensor, nn
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "train_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def model_state(model: nn.Cell) -> Dict[str, np.ndarray]:
    """Parameters keyed by their path inside `model` (stable whatever wraps the model)."""
    return {name: param.asnumpy() for name, param in model.parameters_and_names()}


def _moment_keys(model: nn.Cell, optimizer: nn.Optimizer):
    """(moment1 key, moment2 key, moment1, moment2) per optimized parameter, keyed by its path in `model`."""
    names = {id(param): name for name, param in model.parameters_and_names()}
    for param, m1, m2 in zip(optimizer.parameters, optimizer.moments1, optimizer.moments2):
        yield f"moment1/{names[id(param)]}", f"moment2/{names[id(param)]}", m1, m2


def optimizer_state(model: nn.Cell, optimizer: nn.Optimizer) -> Dict[str, np.ndarray]:
    state = {"global_step": optimizer.global_step.asnumpy()}
    for key1, key2, m1, m2 in _moment_keys(model, optimizer):
        state[key1] = m1.asnumpy()
        state[key2] = m2.asnumpy()
    return state


def save_checkpoint(directory: Path, step: int, model: nn.Cell, optimizer: Optional[nn.Optimizer],
                    train_state: Dict[str, Any]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:08d}"
    tmp = directory / f".tmp_step_{step:08d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(model_state(model), str(tmp / MODEL_FILE))
    if optimizer is not None:
        save_file(optimizer_state(model, optimizer), str(tmp / OPTIMIZER_FILE))
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **train_state}, indent=2))
    for path in tmp.iterdir():  # flush data before the rename makes it visible
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = directory / f".latest_{os.getpid()}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, directory / "latest")
    return final


def latest_checkpoint(directory: Path) -> Optional[Path]:
    pointer = Path(directory) / "latest"
    if not pointer.is_file():
        return None
    path = Path(directory) / pointer.read_text().strip()
    return path if (path / MODEL_FILE).is_file() else None


def resolve_checkpoint(path: Path) -> Path:
    """Accept a run folder, a checkpoint folder or a model.safetensors file; return the weights file."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    latest = latest_checkpoint(path) or latest_checkpoint(path / "checkpoints")
    if latest is None:
        raise CheckpointError(f"{path}: no checkpoint found; pass a run folder written by `mindvl train`, "
                              f"a step_* folder or a {MODEL_FILE} file")
    return latest / MODEL_FILE


def read_weights(path: Path) -> Dict[str, np.ndarray]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({exc}); "
                              f"use an earlier checkpoint or re-export it") from exc


def load_model_weights(model: nn.Cell, path: Path) -> Dict[str, Any]:
    """Load weights into `model` strictly: missing, unexpected or mis-shaped entries are errors.

    Returns the train state saved next to the weights ({} when there is none).
    """
    path = resolve_checkpoint(path)
    weights = read_weights(path)
    params = dict(model.parameters_and_names())
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    if missing or unexpected:
        raise CheckpointError(f"{path}: does not match the model (missing {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}); "
                              f"was it written for another config?")
    for name, param in params.items():
        value = weights[name]
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(f"{path}: {name} has shape {value.shape}, the model expects {param.shape}")
        param.set_data(Tensor(value.astype(np.float32) if value.dtype == np.float16 else value))
    state_file = path.parent / STATE_FILE
    return json.loads(state_file.read_text()) if state_file.is_file() else {}


def load_optimizer_state(model: nn.Cell, optimizer: nn.Optimizer, checkpoint_dir: Path) -> None:
    state = read_weights(Path(checkpoint_dir) / OPTIMIZER_FILE)
    for key1, key2, m1, m2 in _moment_keys(model, optimizer):
        m1.set_data(Tensor(state[key1]))
        m2.set_data(Tensor(state[key2]))
    optimizer.global_step.set_data(Tensor(state["global_step"]))


__all__ = ["CheckpointError", "save_checkpoint", "load_model_weights", "load_optimizer_state",
           "latest_checkpoint", "resolve_checkpoint"]
