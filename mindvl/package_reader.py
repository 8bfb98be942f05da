"""Reading a model package: the one artifact that leaves training, read by serving, lite and `export verify`.

A directory holding
  manifest.json        format, model, versions, source checkpoint, every graph's file and typed
                       inputs/outputs (-1 = dynamic), preprocessing parameters, label names,
                       compression and encryption, the verification tolerance, sha256 of every file;
  <graph>.mindir       one MindIR per deployable graph, `<graph>_b<N>.mindir` for static-batch variants;
  tokenizer.json       the data set's tokenizer (questions and answers);
  config.json          the training config the weights belong to (provenance, evaluation);
  samples/<graph>.safetensors   real test inputs and the outputs the framework computed for them;
  lite2/               (optional) the graphs converted for MindSpore Lite 2.0 and the device assets.
`mindvl.export.package_writer` writes it. This reader needs safetensors (and MindSpore to load a graph) only, so the
deployment side (mindvl.serving, mindvl.lite) imports it and nothing of training. AES-GCM keys for
encrypted graphs are read here too (`read_key`): never from the command line, since arguments end up in
shell history and in `ps` output. A key is 16, 24 or 32 bytes (AES-128/192/256): hex text in a file or
an environment variable, or the raw bytes in a file.
"""
import json
import os
from pathlib import Path
from typing import Iterable, Optional

from safetensors.numpy import load_file

from mindvl.errors import PackageError
from mindvl.files import sha256_file

FORMAT = "mindvl-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4, "integers": "exact"}  # |got - expected| <= atol + rtol * |expected|




def as_tuple(outputs) -> tuple:
    """A graph's outputs as a tuple (a single-output graph returns one tensor)."""
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def read_manifest(package: Path) -> dict:
    """The package's manifest, checked for the format this mindvl reads."""
    path = Path(package) / MANIFEST
    if not path.is_file():
        raise PackageError(f"{path}: missing; {package} is not a model package (write one with `mindvl export`)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise PackageError(f"{path}: not valid JSON ({exc}); re-export the package") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageError(f"{path}: not a {FORMAT} manifest; re-export the package")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PackageError(f"{path}: package format {manifest.get('format_version')}, this mindvl reads "
                           f"{FORMAT_VERSION}; re-export with this mindvl")
    return manifest


def check_files(package: Path, manifest: dict, names: Optional[Iterable[str]] = None) -> None:
    """Raise PackageError naming the first listed file (or only `names`) that is missing or changed."""
    package = Path(package)
    for name, entry in manifest["files"].items():
        if names is not None and name not in names:
            continue
        path = package / name
        if not path.is_file():
            raise PackageError(f"{path}: listed in the manifest but missing; re-export the package")
        if sha256_file(path) != entry["sha256"]:
            raise PackageError(f"{path}: sha256 differs from the manifest: the file changed after export "
                               f"(tampered or corrupted); re-export the package or restore the file")


def load_graph(package: Path, manifest: dict, name: str, key: Optional[bytes] = None):
    """Graph `name` of the package as a callable mindspore.nn.GraphCell (its file's hash checked first).
    MindSpore is imported here, not with the module: a device on the Lite runtime reads packages without it."""
    import mindspore as ms
    from mindspore import nn

    if name not in manifest["graphs"]:
        raise PackageError(f"graph {name}: not in {package} (it has {', '.join(manifest['graphs'])})")
    entry = manifest["graphs"][name]
    check_files(package, manifest, [entry["file"]])
    encrypted = manifest.get("encryption") is not None
    if encrypted and key is None:
        raise PackageError(f"graph {name} ({entry['file']}): the package is encrypted (AES-GCM); pass the key with "
                           f"--key-file PATH or --key-env VAR")
    options = {"dec_key": key, "dec_mode": "AES-GCM"} if encrypted else {}
    try:
        return nn.GraphCell(ms.load(str(Path(package) / entry["file"]), **options))
    except (RuntimeError, ValueError) as exc:
        hint = "wrong key?" if encrypted else "a corrupt or foreign MindIR file"
        raise PackageError(f"graph {name} ({entry['file']}): MindSpore could not load it ({hint}): "
                           f"{str(exc).strip().splitlines()[0]}") from exc


def graph_caller(graphs, lock=None):
    """run(name, inputs) -> the outputs' tuple, over callables taking MindSpore Tensors (GraphCells, or the cells
    they were exported from): arrays are made Tensors, Tensors pass as they are (caches stay on the runtime's side
    between decode steps). `lock`, when given, is held around each call."""
    import contextlib

    def run(name, inputs):
        with lock if lock is not None else contextlib.nullcontext():
            return as_tuple(graphs[name](*(as_tensor(v) for v in inputs)))
    return run


def as_tensor(value):
    """A graph input as a MindSpore Tensor: a Tensor as it is, an array's memory shared (a decode step's caches
    written in place by the engine: Tensor(array) would copy every layer's cache, 10 ms for 12 MB)."""
    import mindspore as ms
    import numpy as np

    return value if isinstance(value, ms.Tensor) else ms.Tensor.from_numpy(np.ascontiguousarray(value))


def as_array(value):
    """A graph output as a numpy array (a MindSpore Tensor's data, or the array a runtime returned)."""
    import numpy as np

    return value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)


def load_samples(package: Path, manifest: dict, name: str) -> tuple:
    """(inputs, expected outputs) of graph `name`, each {tensor name: array} in the graph's order."""
    entry = manifest["graphs"][name]
    check_files(package, manifest, [entry["samples"]])
    stored = load_file(str(Path(package) / entry["samples"]))
    try:
        inputs = {t["name"]: stored[f"input.{t['name']}"] for t in entry["inputs"]}
        outputs = {t["name"]: stored[f"output.{t['name']}"] for t in entry["outputs"]}
    except KeyError as exc:
        raise PackageError(f"{entry['samples']}: has no tensor {exc}; re-export the package") from exc
    return inputs, outputs


# ----------------------------------------------------------------------------- keys

KEY_SIZES = (16, 24, 32)


def _parse(data: bytes, where: str, raw_allowed: bool) -> bytes:
    """Hex text first (a 32-byte file of hex digits is a 16-byte key written as hex), then raw bytes."""
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError is a ValueError too
        key = b""
    if len(key) in KEY_SIZES:
        return key
    if raw_allowed and len(data) in KEY_SIZES:
        return data
    raise PackageError(f"{where}: expected an AES key of 16, 24 or 32 bytes as hex text (32, 48 or 64 hex digits)"
                       f"{' or raw bytes' if raw_allowed else ''}, got {len(data)} bytes; make one with "
                       f"`python -c \"import os; print(os.urandom(32).hex())\" > key.hex`")


def read_key(key_file: Optional[str] = None, key_env: Optional[str] = None) -> Optional[bytes]:
    """The key from `key_file` or from the environment variable named `key_env`; None when neither is given."""
    if key_file and key_env:
        raise PackageError("give the key either as a file (--key-file) or as an environment variable (--key-env), "
                        "not both")
    if key_file:
        path = Path(key_file)
        if not path.is_file():
            raise PackageError(f"key file {path}: no such file")
        return _parse(path.read_bytes(), f"key file {path}", raw_allowed=True)
    if key_env:
        value = os.environ.get(key_env)
        if not value:
            raise PackageError(f"environment variable {key_env}: not set or empty; export it with the key's hex text")
        return _parse(value.encode(), f"environment variable {key_env}", raw_allowed=False)
    return None
