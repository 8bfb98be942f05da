"""Checkpoints: safetensors weights + optimizer state + a train-state JSON, written atomically and verifiable.

Layout: `<dir>/step_00000500/{model.safetensors, optimizer.safetensors, train_state.json}`, `<dir>/latest`
naming the newest complete one and `<dir>/best` (JSON) naming the best one by a validation metric. Each
checkpoint is written into a temporary folder, fsynced and renamed into place, and the pointers are
replaced atomically, so a crash mid-write never leaves a checkpoint that looks complete. The train state
lives in JSON, never in a file name; it records the checkpoint format, the mindvl version and the sha256
of each file, so a resume can tell a truncated or foreign checkpoint from a good one (`verify_checkpoint`,
`find_resumable`) instead of failing hours later.
"""
import hashlib
import json
import os
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "train_state.json"
BEST_FILE = "best"
CHECKPOINT_FORMAT = 2  # raise when the layout or the meaning of a stored key changes
EXTRA_PREFIX = "extra/"
_STEP_NAME = re.compile(r"step_(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def mindvl_version() -> str:
    import mindvl

    version = getattr(mindvl, "__version__", None)
    if version:
        return version
    try:
        return metadata.version("mindvl")
    except metadata.PackageNotFoundError:
        return "unknown"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks so multi-GB weights never sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable; skipped where directories cannot be opened (Windows)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Write a file so that `path` is either absent, the old file or the complete new one: `write`
    fills a temporary file next to it, which is fsynced and renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp_{path.name}_{os.getpid()}")
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return path


AMP_WRAPPER = "_backbone"  # mindspore.amp wraps float32 islands (and the network) in cells holding them so


def parameter_paths(cell: nn.Cell) -> Dict[str, Parameter]:
    """Parameters by their path inside `cell`, without amp's wrapper segments: the names checkpoints
    use, the same whatever wraps the model and whatever precision policy converted it."""
    return {".".join(part for part in name.split(".") if part != AMP_WRAPPER): param
            for name, param in cell.parameters_and_names()}


def model_state(model: nn.Cell) -> Dict[str, np.ndarray]:
    return {name: param.asnumpy() for name, param in parameter_paths(model).items()}


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


def _step_folders(directory: Path) -> List[Tuple[int, Path]]:
    """(step, folder) of every step_* checkpoint folder, newest first by step number."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if p.is_dir() and (m := _STEP_NAME.fullmatch(p.name))]
    return sorted(found, reverse=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_stale_tmp(directory: Path) -> None:
    """Delete `.tmp_*_<pid>` leftovers of a killed writer: its pid is gone, or is ours (a container
    restart reuses pids, and this process has no write in flight when it calls this)."""
    for path in directory.glob(".tmp_*"):
        pid = path.name.rsplit("_", 1)[-1]
        if not pid.isdigit() or (int(pid) != os.getpid() and _pid_alive(int(pid))):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _remove_folder(path: Path) -> None:
    """Rename, then delete: a crash mid-delete leaves a `.tmp_*` leftover, never a half step_* folder."""
    doomed = path.with_name(f".tmp_old_{path.name}_{os.getpid()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def _prune(directory: Path, keep: int, new: Path) -> None:
    """Keep the newest `keep` step_* folders, the new one and the one `best` names; delete the rest."""
    best = best_checkpoint(directory)
    protected = {new.name, best.name if best else None}
    for _, path in _step_folders(directory)[keep:]:
        if path.name not in protected:
            _remove_folder(path)


def save_checkpoint(directory: Path, step: int, model: nn.Cell, optimizer: Optional[nn.Optimizer],
                    train_state: Dict[str, Any], extra: Optional[Dict[str, np.ndarray]] = None,
                    keep: int = 0) -> Path:
    """Write `<directory>/step_<step>` atomically and point `latest` at it; returns the folder.

    `extra`: arrays that must survive a resume besides the optimizer moments (dynamic loss scale,
    learned loss weights), stored in optimizer.safetensors as `extra/<name>` and returned by
    `load_optimizer_state`. `keep` > 0 deletes older step_* folders beyond the newest `keep`, except
    the one `best` names. Stale temporary folders of a killed writer are removed first.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(directory)
    final = directory / f"step_{step:08d}"
    tmp = directory / f".tmp_step_{step:08d}_{os.getpid()}"
    tmp.mkdir()
    arrays = {"model": model_state(model),
              "optimizer": optimizer_state(model, optimizer) if optimizer is not None else {}}
    for name, value in (extra or {}).items():
        arrays["optimizer"][EXTRA_PREFIX + name] = np.array(value, order="C")  # keeps 0-d scalars 0-d
    files = {}
    for kind, filename in (("model", MODEL_FILE), ("optimizer", OPTIMIZER_FILE)):
        if arrays[kind]:
            save_file(arrays[kind], str(tmp / filename))
            _fsync_file(tmp / filename)
            files[filename] = sha256_file(tmp / filename)
    state = {"step": step, **train_state, "format": CHECKPOINT_FORMAT, "mindvl_version": mindvl_version(),
             "files": files}
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
    _fsync_file(tmp / STATE_FILE)
    _fsync_dir(tmp)
    if final.exists():  # a rewrite of the same step (a resumed run): swap, then delete the old one
        old = final.with_name(f".tmp_old_{final.name}_{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(directory)
    atomic_write(directory / "latest", lambda path: path.write_text(final.name))
    if keep > 0:
        _prune(directory, keep, final)
    return final


def latest_checkpoint(directory: Path) -> Optional[Path]:
    pointer = Path(directory) / "latest"
    if not pointer.is_file():
        return None
    path = Path(directory) / pointer.read_text().strip()
    return path if (path / MODEL_FILE).is_file() else None


def mark_best(directory: Path, checkpoint: Path, metric: str, value: float) -> Path:
    """Point `<directory>/best` at `checkpoint` (a step_* folder in `directory`), which pruning then keeps."""
    directory = Path(directory)
    state = read_state(directory / Path(checkpoint).name)
    record = {"checkpoint": Path(checkpoint).name, "metric": metric, "value": float(value), "step": state.get("step")}
    return atomic_write(directory / BEST_FILE, lambda path: path.write_text(json.dumps(record, indent=2)))


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


def _foreign_format(checkpoint: Path, state: Dict[str, Any], what: str) -> CheckpointError:
    version = state.get("mindvl_version", "an unrecorded version")
    fmt = state.get("format", "1 (none recorded)")
    return CheckpointError(
        f"{checkpoint}: {what}: written by mindvl {version} with checkpoint format {fmt}; this mindvl "
        f"({mindvl_version()}) reads format {CHECKPOINT_FORMAT}: finish that run with its mindvl version, or "
        f"start a fresh run (its weights still load with `mindvl eval --run {checkpoint}`, "
        f"`mindvl export --checkpoint {checkpoint}` or mindvl.train.checkpoint.load_model_weights)")


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
    for _, path in _step_folders(directory):
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


def read_weights(path: Path) -> Dict[str, np.ndarray]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable or truncated safetensors file ({exc}); "
                              f"use an earlier checkpoint or re-export it") from exc


def assign_state(model: nn.Cell, weights: Dict[str, np.ndarray], source: str) -> None:
    """Set every parameter of `model` from `weights` by name, strictly: missing, unexpected or mis-shaped
    entries raise CheckpointError naming `source` and the parameter."""
    params = parameter_paths(model)
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
    loads: weights are plain safetensors (resuming needs `verify_checkpoint` too).
    """
    path = resolve_checkpoint(path)
    assign_state(model, read_weights(path), str(path))
    return read_state(path.parent) if (path.parent / STATE_FILE).is_file() else {}


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


__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "atomic_write", "sha256_file", "save_checkpoint",
           "load_model_weights", "load_optimizer_state", "latest_checkpoint", "resolve_checkpoint",
           "read_weights", "mark_best", "read_best", "best_checkpoint", "verify_checkpoint", "find_resumable",
           "check_same_model", "read_state", "parameter_paths"]
