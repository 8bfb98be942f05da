"""A training run's folder and reading the checkpoints in it: the one module that knows the layout.

    <run>/config.json                       the resolved training config (every consumer rebuilds from it)
    <run>/metrics.jsonl, <run>/tb/          logs
    <run>/checkpoints/step_<8 digits>/      model.safetensors, optimizer.safetensors, train_state.json
    <run>/checkpoints/latest, .../best      the newest complete checkpoint, the best by a validation metric

A leaf: reading a run needs MindSpore, NumPy and safetensors, never the trainer (which writes runs through
mindvl.train.checkpoint), so evaluation, export and the data build's alignment filter load runs without
importing training code.
"""
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn
from safetensors import SafetensorError
from safetensors.numpy import load_file

from mindvl.errors import CheckpointError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "train_state.json"
BEST_FILE = "best"
LATEST_FILE = "latest"
CHECKPOINT_FORMAT = 2  # raise when the layout or the meaning of a stored key changes
EXTRA_PREFIX = "extra/"
STEP_NAME = re.compile(r"step_(\d+)")




AMP_WRAPPER = "_backbone"  # the attribute under which mindspore.amp wraps float32 islands (and the network)


def parameter_paths(cell: nn.Cell) -> Dict[str, Parameter]:
    """Parameters by their path inside `cell`, without amp's wrapper segments: the names checkpoints
    use, the same whatever wraps the model and whatever precision policy converted it."""
    return {".".join(part for part in name.split(".") if part != AMP_WRAPPER): param
            for name, param in cell.parameters_and_names()}


def step_folders(directory: Path) -> List[Tuple[int, Path]]:
    """(step, folder) of every step_* checkpoint folder, newest first by step number."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if p.is_dir() and (m := STEP_NAME.fullmatch(p.name))]
    return sorted(found, reverse=True)


def latest_checkpoint(directory: Path) -> Optional[Path]:
    pointer = Path(directory) / LATEST_FILE
    if not pointer.is_file():
        return None
    path = Path(directory) / pointer.read_text().strip()
    return path if (path / MODEL_FILE).is_file() else None


def read_best(directory: Path) -> Optional[Dict[str, Any]]:
    """The `best` record ({"checkpoint", "metric", "value", "step"}), or None when no best is marked; a
    resumed run compares new evaluations against its value."""
    pointer = Path(directory) / BEST_FILE
    if not pointer.is_file():
        return None
    try:
        record = json.loads(pointer.read_text())
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("checkpoint"), str):
        raise CheckpointError(f"{pointer}: unreadable best-checkpoint pointer; delete it (the next "
                              f"evaluation marks a new best)")
    return record


def best_checkpoint(directory: Path) -> Optional[Path]:
    record = read_best(directory)
    if record is None:
        return None
    path = Path(directory) / record["checkpoint"]
    return path if path.is_dir() else None


def is_run_folder(path) -> bool:
    """A training run's folder, a step_* checkpoint of one, or a folder of weights with a run's config
    (a soup, a merged run): what load_model reads, as opposed to a converted folder (whose config.json
    has a "format")."""
    path = Path(path)
    if (path / CHECKPOINTS).is_dir() or (path / STATE_FILE).is_file():
        return True
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model" in config and "train" in config and (path / MODEL_FILE).is_file()


def resolve_checkpoint(path: Path) -> Path:
    """Accept a run folder, a checkpoint folder or a model.safetensors file; return the weights file."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    latest = latest_checkpoint(path) or latest_checkpoint(path / CHECKPOINTS)
    if latest is None:
        raise CheckpointError(f"{path}: no checkpoint found; pass a run folder written by `mindvl train`, "
                              f"a step_* folder or a {MODEL_FILE} file")
    return latest / MODEL_FILE


def read_state(checkpoint: Path) -> Dict[str, Any]:
    """A checkpoint folder's train state as written, without hashing its files (verify_checkpoint does)."""
    state_file = Path(checkpoint) / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{state_file}: missing, so the checkpoint was never completely written; "
                              f"resume from an earlier checkpoint (--resume auto picks the newest good one)")
    try:
        state = json.loads(state_file.read_text())
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{state_file}: unparsable ({exc}); resume from an earlier checkpoint "
                              f"(--resume auto picks the newest good one)") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_file}: expected a JSON object, got {type(state).__name__}; "
                              f"resume from an earlier checkpoint")
    return state


def find_run_config(checkpoint: Path) -> Path:
    """The run's config.json sits in the run folder, above checkpoints/step_*/model.safetensors."""
    for folder in [Path(checkpoint), *Path(checkpoint).parents][:5]:
        if (folder / CONFIG_FILE).is_file():
            return folder / CONFIG_FILE
    raise CheckpointError(f"{checkpoint}: no {CONFIG_FILE} found in it or its parent folders; "
                          f"pass the run folder written by `mindvl train`")


def read_run_config(checkpoint: Path) -> Dict[str, Any]:
    """The config a checkpoint was trained with, as the dict the trainer wrote."""
    return json.loads(find_run_config(checkpoint).read_text())


def read_weights(path: Path) -> Dict[str, np.ndarray]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({exc}); "
                              f"use an earlier checkpoint or re-export it") from exc


def assign_state(model: nn.Cell, weights: Dict[str, np.ndarray], source: str, base: Sequence[str] = ()) -> None:
    """Set every parameter of `model` from `weights` by name, strictly: missing, unexpected or mis-shaped
    entries raise CheckpointError naming `source` and the parameter. `base`: the paths of the parts (e.g.
    "vision", "decoder", "tower.vit") whose frozen weights the model already holds from their converted folders:
    their parameters other than LoRA adapters may be absent (a checkpoint stores only what trained)."""
    from mindvl.cells.linear import is_adapter

    params = parameter_paths(model)
    held = {name for name in params if any(name.startswith(f"{part}.") for part in base) and not is_adapter(name)}
    params = {name: param for name, param in params.items() if name in weights or name not in held}
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    if missing or unexpected:
        raise CheckpointError(f"{source}: does not match the model (missing {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}); "
                              f"was it written for another config?")
    for name, param in params.items():
        value = weights[name]
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(f"{source}: {name} has shape {value.shape}, the model expects {param.shape}")
        param.set_data(Tensor(np.ascontiguousarray(value.astype(np.float32) if value.dtype == np.float16 else value)))


def load_model_weights(model: nn.Cell, path: Path) -> Dict[str, Any]:
    """Load weights into `model` strictly: missing, unexpected or mis-shaped entries are errors.

    Returns the train state saved next to the weights ({} when there is none). Any checkpoint format
    loads: weights are plain safetensors (resuming needs `verify_checkpoint` too). A checkpoint whose
    state records frozen base weights ("base": converted folders and their sha256) leaves those parts as
    `model` holds them: load the folders into it first (mindvl.model_factory.load_model and the Trainer do).
    """
    path = resolve_checkpoint(path)
    state = read_state(path.parent) if (path.parent / STATE_FILE).is_file() else {}
    base = state.get("base", {})  # each part at its path in the model (recorded since the ViT towers; else its name)
    assign_state(model, read_weights(path), str(path), tuple(part.get("path", kind) for kind, part in base.items()))
    return state
