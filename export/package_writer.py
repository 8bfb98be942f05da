"""Writing a model package (the layout and the reader: mindvl/package_reader.py) from a trained model.

The directory is assembled next to its destination and renamed into place, so a package either exists
complete or not at all.
"""
import datetime
import json
import shutil
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn
from safetensors.numpy import save_file

from mindvl.cells import count_cell_parameters
from mindvl.config import Config
from mindvl.data import create_dataset, load_meta, load_tokenizer
from mindvl.errors import PackageError
from mindvl.export.graphs import DTYPES, GraphSpec, export_graph, graph_specs
from mindvl.export.lite2_folder import write_lite2
from mindvl.files import sha256_file, swap_folder, work_folder
from mindvl.package_reader import FORMAT, FORMAT_VERSION, MANIFEST, TOLERANCE, as_tuple
from mindvl.preprocess import preprocess_dict
from mindvl.progress import progress_bar
from mindvl.version import __version__

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


def file_entries(folder: Path) -> Dict[str, dict]:
    return {str(p.relative_to(folder)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def manifest_head(name: str, model: nn.Cell, source: Mapping[str, object], version: int,
                  compression: Optional[Mapping[str, object]], key: Optional[bytes]) -> dict:
    """The manifest fields every package starts with: format, model (`name`: the recipe's), versions,
    provenance, compression."""
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "name": name, "version": int(version),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mindvl_version": __version__, "mindspore_version": ms.__version__,
        "source": dict(source), "parameters": count_cell_parameters(model),
        "compression": dict(compression or {"method": "none"}),
        "encryption": {"mode": "AES-GCM", "applies_to": "every .mindir; the key is never stored"} if key else None,
    }


def write_graph(spec: GraphSpec, net: nn.Cell, inputs: Mapping[str, np.ndarray], folder: Path,
                key: Optional[bytes]) -> dict:
    """Export `net` as graph `spec` into `folder`, store the sample `inputs` with the framework's outputs;
    -> its manifest entry."""
    net.set_train(False)
    path = export_graph(net, spec.name, spec.inputs, folder / f"{spec.name}.mindir", key)
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
    lite2_batch: also write lite2/ (export/lite2_folder.py): every graph down-converted for the MindSpore Lite 2.0
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

    work = work_folder(out)
    (work / "samples").mkdir()
    try:
        model.set_train(False)
        entries = {spec.name: write_graph(spec, spec.build(model), sample_graph_inputs(spec, columns), work, key)
                   for spec in progress_bar(specs, desc="export graphs", disable=not progress, leave=False)}
        tokenizer.save(work / "tokenizer.json")
        lite2 = None if lite2_batch is None else write_lite2(work, model, chosen, lite2_batch, tokenizer, labels,
                                                             cfg.preprocess)
        (work / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        manifest = {
            **manifest_head(cfg.name, model, source, version, compression, key),
            "preprocess": {**preprocess_dict(cfg.preprocess), "tokenizer": "tokenizer.json",
                           "pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id},
            "labels": labels,
            "graphs": entries,
            **({"lite2": lite2} if lite2 else {}),
            "tolerance": TOLERANCE,
            "files": file_entries(work),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        swap_folder(work, out)
    except BaseException:  # nothing half-written stays behind (the old package, if any, is untouched)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out
