"""The model package: the one artifact that leaves training (read by serving, lite and `export verify`).

A directory holding
  manifest.json        format, model, versions, source checkpoint, every graph's file and typed
                       inputs/outputs (-1 = dynamic), preprocessing parameters, label names,
                       compression and encryption, the verification tolerance, sha256 of every file;
  <graph>.mindir       one MindIR per deployable graph (export/graphs.py), `<graph>_b<N>.mindir` for
                       static-batch variants;
  tokenizer.json       the data set's tokenizer (questions and answers);
  config.json          the training config the weights belong to (provenance, evaluation);
  samples/<graph>.safetensors   real test inputs and the outputs the framework computed for them.
The directory is assembled next to its destination and renamed into place, so a package either exists
complete or not at all.
"""
import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from mindvl.cells.kernels import standard_kernels
from mindvl.config import Config
from mindvl.data import create_dataset, load_meta, load_tokenizer
from mindvl.export.errors import PackageError
from mindvl.export.graphs import DTYPES, GraphSpec, TensorSpec, graph_specs
from mindvl.export.lite2 import write_lite2
from mindvl.preprocess import preprocess_dict
from mindvl.train.checkpoint import mindvl_version, sha256_file

FORMAT = "mindvl-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4, "integers": "exact"}  # |got - expected| <= atol + rtol * |expected|
SAMPLE_MODALITIES = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))  # (use_text, use_audio) cycled over the samples
SAMPLE_COLUMNS = {"text_ids": "question_ids", "text_mask": "question_mask"}  # graph input -> data column


def sample_inputs(cfg: Config, count: int) -> Dict[str, np.ndarray]:
    """`count` real test rows in the data set's columns; the question modality cycles text, audio, both."""
    rows: Dict[str, list] = {}
    for batch in create_dataset(cfg, "test", question_modality="both", shard_id=0, num_shards=1) \
            .create_dict_iterator(num_epochs=1, output_numpy=True):
        for name, value in batch.items():
            rows.setdefault(name, []).append(value)
        if sum(len(v) for v in rows["image"]) >= count:
            break
    columns = {name: np.concatenate(values)[:count] for name, values in rows.items()}
    if len(columns["image"]) < count:
        raise PackageError(f"the test split of {cfg.data.root} has {len(columns['image'])} samples, fewer than the "
                           f"{count} the package stores; lower --static-batch")
    flags = np.array([SAMPLE_MODALITIES[i % len(SAMPLE_MODALITIES)] for i in range(count)], np.float32)
    columns["use_text"], columns["use_audio"] = flags[:, 0], flags[:, 1]
    return columns


def sample_graph_inputs(spec: GraphSpec, columns: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    batch = spec.inputs[0].shape[0]
    count = batch if batch > 0 else len(columns["image"])
    return {t.name: np.ascontiguousarray(columns[SAMPLE_COLUMNS.get(t.name, t.name)][:count]
                                         .astype(DTYPES[t.dtype][1])) for t in spec.inputs}


def as_tuple(outputs) -> tuple:
    """A graph's outputs as a tuple (a single-output graph returns one tensor)."""
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def export_graph(net: nn.Cell, name: str, inputs: Sequence[TensorSpec], path: Path,
                 key: Optional[bytes] = None) -> Path:
    """ms.export `net` as MindIR at `path` (AES-GCM encrypted when `key` is given), with standard operators
    only; errors name the graph."""
    path = Path(path)
    options = {"enc_key": key, "enc_mode": "AES-GCM"} if key else {}
    try:
        with standard_kernels(net):  # a model trained with fused kernels exports MindSpore's operators
            ms.export(net, *(t.placeholder() for t in inputs), file_name=str(path.with_suffix("")),
                      file_format="MINDIR", **options)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise PackageError(f"graph {name}: MindIR export failed: {str(exc).strip().splitlines()[0]}") from exc
    if not path.is_file():
        raise PackageError(f"graph {name}: ms.export wrote no {path.name}")
    return path


def _file_entries(folder: Path) -> Dict[str, dict]:
    return {str(p.relative_to(folder)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def parameter_count(model: nn.Cell) -> int:
    return int(sum(np.prod(p.shape) for p in model.get_parameters()))


def _write_graph(spec: GraphSpec, model: nn.Cell, columns: Mapping[str, np.ndarray], folder: Path,
                 key: Optional[bytes]) -> dict:
    """Export one graph into `folder`, store its samples with the framework's outputs; -> its manifest entry."""
    net = spec.build(model)
    net.set_train(False)
    path = export_graph(net, spec.name, spec.inputs, folder / f"{spec.name}.mindir", key)
    inputs = sample_graph_inputs(spec, columns)
    expected = as_tuple(net(*(ms.Tensor(v) for v in inputs.values())))
    save_file({**{f"input.{k}": v for k, v in inputs.items()},
               **{f"output.{t.name}": np.ascontiguousarray(o.asnumpy()) for t, o in zip(spec.outputs, expected)}},
              str(folder / "samples" / f"{spec.name}.safetensors"))
    batch = spec.inputs[0].shape[0]
    return {"file": path.name, "description": spec.description, "batch": "dynamic" if batch < 0 else batch,
            "inputs": [t.to_dict() for t in spec.inputs], "outputs": [t.to_dict() for t in spec.outputs],
            "samples": f"samples/{spec.name}.safetensors"}


def write_package(cfg: Config, model: nn.Cell, out: Path, source: Mapping[str, object],
                  static_batches: Sequence[int] = (), key: Optional[bytes] = None,
                  compression: Optional[Mapping[str, object]] = None, version: int = 1, force: bool = False,
                  progress: bool = True, graphs: Sequence[str] = (), lite2_batch: Optional[int] = None) -> Path:
    """Export every graph of `model` (a MultimodalModel sized by `cfg`, in eval mode) into the package `out`.

    source: where the weights came from (checkpoint path, its sha256, step), recorded as given.
    static_batches: also write each graph with these fixed batch sizes. key: AES-GCM key (16/24/32 bytes)
    encrypting every .mindir. compression: what made this model from its source (recorded as given).
    graphs: only these graphs (default: all; a device that only answers questions needs only "vqa").
    lite2_batch: also write lite2/ (export/lite2.py): every graph down-converted for the MindSpore Lite 2.0
    runtime at this static batch, plus the device assets; its `<graph>_b<N>` graphs are the reference.
    The stored samples' expected outputs are computed by the framework cells that were exported.
    """
    out = Path(out)
    if out.exists() and not force:
        raise PackageError(f"{out}: already exists; pass --force to replace it or choose another --out")
    if any(b <= 0 for b in static_batches):
        raise PackageError(f"--static-batch: expected positive batch sizes, got {list(static_batches)}")
    if lite2_batch is not None:
        if key:
            raise PackageError("--target lite2 with a key: Lite 2.0's own decryption is untested; export the lite2 "
                               "package without --key-file/--key-env, or without --target lite2")
        static_batches = (*static_batches, lite2_batch)
    tokenizer = load_tokenizer(cfg.data.root)
    labels = load_meta(cfg.data.root)["answers"]
    available = graph_specs(cfg.preprocess, cfg.model.embed_dim, len(labels), tokenizer)
    unknown = sorted(set(graphs) - set(available))
    if unknown:
        raise PackageError(f"--graph {', '.join(unknown)}: no such graph; choose from {', '.join(available)}")
    chosen = [spec for name, spec in available.items() if not graphs or name in graphs]
    specs = chosen + [spec.static(b) for b in sorted(set(static_batches)) for spec in chosen]
    columns = sample_inputs(cfg, max([len(SAMPLE_MODALITIES), *static_batches]))

    work = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "samples").mkdir(parents=True)
    try:
        model.set_train(False)
        entries = {spec.name: _write_graph(spec, model, columns, work, key)
                   for spec in tqdm(specs, desc="export graphs", disable=not progress, leave=False)}
        tokenizer.save(work / "tokenizer.json")
        lite2 = None if lite2_batch is None else write_lite2(work, model, chosen, lite2_batch, tokenizer, labels,
                                                             cfg.preprocess)
        (work / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "name": cfg.name, "version": int(version),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mindvl_version": mindvl_version(), "mindspore_version": ms.__version__,
            "source": dict(source), "parameters": parameter_count(model),
            "compression": dict(compression or {"method": "none"}),
            "encryption": {"mode": "AES-GCM", "applies_to": "every .mindir; the key is never stored"} if key else None,
            "preprocess": {**preprocess_dict(cfg.preprocess), "tokenizer": "tokenizer.json",
                           "pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id},
            "labels": labels,
            "graphs": entries,
            **({"lite2": lite2} if lite2 else {}),
            "tolerance": TOLERANCE,
            "files": _file_entries(work),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(work, out)
    except BaseException:  # nothing half-written stays behind (the old package, if any, is untouched)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


# ----------------------------------------------------------------------------- reading

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


def load_graph(package: Path, manifest: dict, name: str, key: Optional[bytes] = None) -> nn.GraphCell:
    """Graph `name` of the package as a callable cell (its file's hash checked first)."""
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
