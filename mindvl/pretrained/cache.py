"""Content-addressed cache of a frozen encoder's outputs, so it runs once per distinct input.

A frozen encoder maps the same input to the same output for as long as its weights stay the same, so
its outputs are stored under a key made of the weights' sha256 (the converted folder's, from its
config.json, or that of the parameters an encoder cell holds), the input settings that change the
output (image size, normalisation, ...) and the input's own bytes. Another checkpoint, another setting or another input is another key: a stale entry
can never be read. Entries are .npy files written under a temporary name and renamed; an entry that
does not load (a crash of another writer's disk, a truncated copy) is recomputed and counted.

    cache = FeatureCache(root, "pretrained/dinov2", settings={"image_size": 112})
    tokens = cache.get_or_compute([image_bytes, ...], encode_batch)  # encode_batch(list) -> array
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Union

import numpy as np

from mindvl.files import atomic_write

from .store import WEIGHTS_FILE, read_config


def parameters_sha256(cell) -> str:
    """sha256 over a cell's parameters (names, shapes, dtypes and values), in name order."""
    digest = hashlib.sha256()
    for name, param in sorted(cell.parameters_and_names(), key=lambda item: item[0]):
        value = np.ascontiguousarray(param.asnumpy())
        digest.update(f"{name}:{value.dtype.str}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    computed: int = 0
    damaged: int = 0  # entries that did not load and were recomputed


class FeatureCache:
    """Outputs of one converted encoder under one set of input settings, stored under `root`."""

    def __init__(self, root: Union[str, Path], encoder, settings: Dict, dtype=np.float16,
                 batch_size: int = 32) -> None:
        """encoder: a converted folder, or the encoder cell itself (its weights as they are now)."""
        weights = read_config(encoder)["files"][WEIGHTS_FILE] if isinstance(encoder, (str, Path)) \
            else parameters_sha256(encoder)
        self.namespace = hashlib.sha256(
            json.dumps({"weights": weights, "settings": settings, "dtype": np.dtype(dtype).name},
                       sort_keys=True).encode()).hexdigest()
        self.folder = Path(root) / self.namespace[:16]
        self.dtype = np.dtype(dtype)
        self.batch_size = int(batch_size)
        self.stats = CacheStats()

    def key(self, data: bytes) -> str:
        return hashlib.sha256(self.namespace.encode() + bytes(data)).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.npy"

    def _load(self, path: Path):
        try:
            return np.load(path, allow_pickle=False)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, EOFError):
            self.stats.damaged += 1
            return None

    def _store(self, path: Path, value: np.ndarray) -> None:
        def save(tmp: Path) -> None:
            with open(tmp, "wb") as handle:
                np.save(handle, np.asarray(value, self.dtype))

        atomic_write(path, save, durable=False)

    def get(self, data: bytes):
        """The cached output for one input, or None (missing or damaged)."""
        return self._load(self._path(self.key(data)))

    def get_or_compute(self, inputs: Sequence[bytes],
                       compute: Callable[[List[bytes]], Sequence[np.ndarray]]) -> List[np.ndarray]:
        """The cached output for each input; missing ones are computed `batch_size` at a time with
        `compute(list of inputs) -> n outputs` (an array (n, ...) or a list of arrays) and stored.
        Equal inputs are computed once."""
        keys = [self.key(data) for data in inputs]
        found = self._complete(keys, inputs, compute)
        return [found[key] for key in keys]

    def fill(self, inputs: Sequence[bytes], compute: Callable[[List[bytes]], Sequence[np.ndarray]],
             progress: str = "") -> None:
        """`get_or_compute` without returning the outputs: makes every input's entry present and loadable.
        `progress`: a label for a progress bar over the computations ("": none)."""
        self._complete([self.key(data) for data in inputs], inputs, compute, keep=False, progress=progress)

    def _complete(self, keys: List[str], inputs: Sequence[bytes], compute, keep: bool = True,
                  progress: str = "") -> Dict[str, np.ndarray]:
        from mindvl.progress import progress_bar

        found: Dict[str, np.ndarray] = {}
        present = set()
        for key in dict.fromkeys(keys):
            value = self._load(self._path(key))
            if value is not None:
                present.add(key)
                if keep:
                    found[key] = value
        self.stats.hits += sum(key in present for key in keys)
        missing = [key for key in dict.fromkeys(keys) if key not in present]
        first_input: Dict[str, bytes] = {}
        for key, data in zip(keys, inputs):
            first_input.setdefault(key, data)
        bar = progress_bar(total=len(missing), desc=progress, unit="input", disable=not progress or not missing)
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start:start + self.batch_size]
            outputs = compute([first_input[key] for key in chunk])
            if len(outputs) != len(chunk):
                raise ValueError(f"feature cache: compute returned {len(outputs)} outputs for {len(chunk)} inputs")
            for key, value in zip(chunk, outputs):
                self._store(self._path(key), value)
                if keep:
                    found[key] = np.asarray(value, self.dtype)
            self.stats.computed += len(chunk)
            bar.update(len(chunk))
        bar.close()
        return found
