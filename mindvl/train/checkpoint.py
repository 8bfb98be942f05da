"""Checkpoints: safetensors weights + optimizer state + a train-state JSON, written atomically and verifiable.

Layout: `<dir>/step_00000500/{model.safetensors, optimizer.safetensors, train_state.json}`, `<dir>/latest`
naming the newest complete one and `<dir>/best` (JSON) naming the best one by a validation metric. Each
checkpoint is written into a temporary folder, fsynced and renamed into place, and the pointers are
replaced atomically, so a crash mid-write never leaves a checkpoint that looks complete. The train state
lives in JSON, never in a file name; it records the checkpoint format, the mindvl version and the sha256
of each file, so a resume can tell a truncated or foreign checkpoint from a good one (`verify_checkpoint`,
`find_resumable`) instead of failing hours later.
"""
import json
import os
import shutil
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, Optional

import numpy as np
from mindspore import Tensor, nn
from safetensors.numpy import save_file

from mindvl.errors import CheckpointError
from mindvl.files import atomic_write, pid_alive, sha256_file, swap_folder, temporary_name, work_folder
from mindvl.runs import (BEST_FILE, CHECKPOINT_FORMAT, EXTRA_PREFIX, LATEST_FILE, MODEL_FILE, OPTIMIZER_FILE,
                         STATE_FILE, best_checkpoint, parameter_paths, read_state, read_weights, step_folders)
from mindvl.version import __version__


def model_state(model: nn.Cell, exclude: AbstractSet[str] = frozenset()) -> Dict[str, np.ndarray]:
    return {name: param.asnumpy() for name, param in parameter_paths(model).items() if name not in exclude}


def _moment_keys(model: nn.Cell, optimizer: nn.Optimizer):
    """(moment1 key, moment2 key, moment1, moment2) per optimized parameter, keyed by its path in `model`;
    a parameter outside the model (learned loss weights) by `outside/<its name>`."""
    names = {id(param): name for name, param in parameter_paths(model).items()}
    for param, m1, m2 in zip(optimizer.parameters, optimizer.moments1, optimizer.moments2):
        name = names.get(id(param), f"outside/{param.name}")
        yield f"moment1/{name}", f"moment2/{name}", m1, m2


def optimizer_state(model: nn.Cell, optimizer: nn.Optimizer) -> Dict[str, np.ndarray]:
    state = {"global_step": optimizer.global_step.asnumpy()}
    for key1, key2, m1, m2 in _moment_keys(model, optimizer):
        state[key1] = m1.asnumpy()
        state[key2] = m2.asnumpy()
    return state


def _remove_stale_tmp(directory: Path) -> None:
    """Delete `.tmp_*_<pid>` leftovers of a killed writer: its pid is gone, or is ours (a container
    restart reuses pids, and this process has no write in flight when it calls this)."""
    for path in directory.glob(".tmp_*"):
        pid = path.name.rsplit("_", 1)[-1]
        if not pid.isdigit() or (int(pid) != os.getpid() and pid_alive(int(pid))):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _remove_folder(path: Path) -> None:
    """Rename, then delete: a crash mid-delete leaves a `.tmp_*` leftover, never a half step_* folder."""
    doomed = temporary_name(path, "tmp_old")
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def _prune(directory: Path, keep: int, new: Path) -> None:
    """Keep the newest `keep` step_* folders, the new one and the one `best` names; delete the rest."""
    best = best_checkpoint(directory)
    protected = {new.name, best.name if best else None}
    for _, path in step_folders(directory)[keep:]:
        if path.name not in protected:
            _remove_folder(path)


def save_checkpoint(directory: Path, step: int, model: nn.Cell, optimizer: Optional[nn.Optimizer],
                    train_state: Dict[str, Any], extra: Optional[Dict[str, np.ndarray]] = None,
                    keep: int = 0, exclude: AbstractSet[str] = frozenset()) -> Path:
    """Write `<directory>/step_<step>` atomically and point `latest` at it; returns the folder.

    `extra`: arrays that must survive a resume besides the optimizer moments (dynamic loss scale,
    learned loss weights), stored in optimizer.safetensors as `extra/<name>` and returned by
    `load_optimizer_state`. `keep` > 0 deletes older step_* folders beyond the newest `keep`, except
    the one `best` names. Stale temporary folders of a killed writer are removed first. `exclude`: the
    parameters not stored, the frozen base weights `train_state["base"]` identifies (pretrained.bind.base_weights).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(directory)
    final = directory / f"step_{step:08d}"
    tmp = work_folder(final)
    arrays = {"model": model_state(model, exclude),
              "optimizer": optimizer_state(model, optimizer) if optimizer is not None else {}}
    for name, value in (extra or {}).items():
        arrays["optimizer"][EXTRA_PREFIX + name] = np.array(value, order="C")  # keeps 0-d scalars 0-d
    files = {}
    for kind, filename in (("model", MODEL_FILE), ("optimizer", OPTIMIZER_FILE)):
        if arrays[kind]:
            save_file(arrays[kind], str(tmp / filename))
            files[filename] = sha256_file(tmp / filename)
    state = {"step": step, **train_state, "format": CHECKPOINT_FORMAT, "mindvl_version": __version__,
             "files": files}
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
    swap_folder(tmp, final)  # fsynced; a rewrite of the same step (a resumed run) replaces the old folder whole
    atomic_write(directory / LATEST_FILE, lambda path: path.write_text(final.name))
    if keep > 0:
        _prune(directory, keep, final)
    return final


def mark_best(directory: Path, checkpoint: Path, metric: str, value: float) -> Path:
    """Point `<directory>/best` at `checkpoint` (a step_* folder in `directory`), which pruning then keeps."""
    directory = Path(directory)
    state = read_state(directory / Path(checkpoint).name)
    record = {"checkpoint": Path(checkpoint).name, "metric": metric, "value": float(value), "step": state.get("step")}
    return atomic_write(directory / BEST_FILE, lambda path: path.write_text(json.dumps(record, indent=2)))


def _foreign_format(checkpoint: Path, state: Dict[str, Any], what: str) -> CheckpointError:
    version = state.get("mindvl_version", "an unrecorded version")
    fmt = state.get("format", "1 (none recorded)")
    return CheckpointError(
        f"{checkpoint}: {what}: written by mindvl {version} with checkpoint format {fmt}; this mindvl "
        f"({__version__}) reads format {CHECKPOINT_FORMAT}: finish that run with its mindvl version, or "
        f"start a fresh run (its weights still load with `mindvl eval --run {checkpoint}`, "
        f"`mindvl export --checkpoint {checkpoint}` or mindvl.runs.load_model_weights)")


def verify_checkpoint(path: Path) -> Dict[str, Any]:
    """Check a step_* folder before resuming from it: a readable train state of this checkpoint format
    and every recorded file present with its recorded sha256. Returns the train state."""
    path = Path(path)
    state = read_state(path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise _foreign_format(path, state, "unsupported checkpoint format")
    files = state.get("files")
    if not isinstance(files, dict) or MODEL_FILE not in files:
        raise CheckpointError(f"{path / STATE_FILE}: records no sha256 for {MODEL_FILE}; resume from an "
                              f"earlier checkpoint")
    for filename, recorded in files.items():
        file = path / filename
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (train_state.json records it); the checkpoint is "
                                  f"incomplete: resume from an earlier checkpoint")
        actual = sha256_file(file)
        if actual != recorded:
            raise CheckpointError(f"{file}: truncated or corrupt: sha256 {actual} != recorded {recorded}; "
                                  f"resume from an earlier checkpoint")
    return state


def find_resumable(directory: Path, warn: Callable[[str], None]) -> Optional[Path]:
    """The newest step_* folder (by step number: `latest` lags when a crash hits between the rename
    and the pointer) that passes `verify_checkpoint`. Each newer one that fails is reported through
    `warn`. None when there is no step_* folder; CheckpointError listing every problem when all fail."""
    problems = []
    for _, path in step_folders(directory):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        for problem in problems:
            warn(f"{problem}; skipping it and falling back to the previous good checkpoint {path.name}")
        return path
    if problems:
        raise CheckpointError(f"{directory}: no usable checkpoint:\n  " + "\n  ".join(problems) +
                              "\nstart a fresh run (another train.output_dir) or repair one of them")
    return None


def _flatten(value: Any, prefix: str) -> Dict[str, Any]:
    if isinstance(value, dict):
        flat = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}"))
        return flat
    return {prefix: value}


def check_same_model(checkpoint: Path, state: Dict[str, Any], model_config: Dict[str, Any]) -> None:
    """Refuse to resume a run of another model: `state["model_config"]` (the trainer saves `cfg.model` as
    a dict) must equal this run's `model_config`; the error names up to 5 differing keys."""
    if "model_config" not in state:
        raise _foreign_format(checkpoint, state, "its train state records no model config")
    absent = "absent"
    there = _flatten(state["model_config"], "model")
    here = _flatten(json.loads(json.dumps(model_config)), "model")  # tuples become lists, as when saved
    differing = sorted(key for key in set(there) | set(here) if there.get(key, absent) != here.get(key, absent))
    if differing:
        shown = "; ".join(f"{key} is {there.get(key, absent)!r} there, {here.get(key, absent)!r} here"
                          for key in differing[:5])
        more = f"; and {len(differing) - 5} more" if len(differing) > 5 else ""
        raise CheckpointError(f"{checkpoint}: this resume directory holds a run of another model: {shown}{more}; "
                              f"resume with the same model config or pick another train.output_dir")


def load_optimizer_state(model: nn.Cell, optimizer: nn.Optimizer, checkpoint_dir: Path) -> Dict[str, np.ndarray]:
    """Restore the moments and step count; returns the `extra` arrays saved with them ({} when none)."""
    path = Path(checkpoint_dir) / OPTIMIZER_FILE
    state = read_weights(path)
    wanted = ["global_step"] + [key for keys in _moment_keys(model, optimizer) for key in keys[:2]]
    missing = [key for key in wanted if key not in state]
    if missing:
        raise CheckpointError(f"{path}: no optimizer state for {missing[:5]}{'...' if len(missing) > 5 else ''}; "
                              f"was it written for another model or optimizer?")
    for key1, key2, m1, m2 in _moment_keys(model, optimizer):
        m1.set_data(Tensor(state[key1]))
        m2.set_data(Tensor(state[key2]))
    optimizer.global_step.set_data(Tensor(state["global_step"]))
    return {key[len(EXTRA_PREFIX):]: value for key, value in state.items() if key.startswith(EXTRA_PREFIX)}
