"""The package's lite2/ folder: every graph traced for the MindSpore Lite 2.0 runtime and down-converted
(export/lite2_convert.py), plus the plain-text device assets the C++ runner reads.

Lite 2.0 needs static shapes (a `None` batch dimension does not build; a static export plus
`Model.Resize` works), and its LayerNorm kernel returns wrong rows for batch index >= 1 on more than
one thread, so the lite2 export traces the model with LayerNorm decomposed into standard ops
(cells/portable.py) and passes the other graphs' standard ops through unchanged.
"""
import json
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

from mindvl.cells.norm import LayerNorm
from mindvl.cells.portable import DecomposedLayerNorm, substituted
from mindvl.export.graphs import export_graph
from mindvl.export.lite2_convert import LITE2_MINDIR_VERSION, convert_mindir
from mindvl.model_package import PackageError

FOLDER = "lite2"  # inside the package: the converted graphs and the device assets
SUBSTITUTED = {"LayerNorm": "ReduceMean, Sub, Mul, Add, Sqrt, RealDiv (Lite 2.0's LayerNorm kernel is wrong on >1 thread)"}


def _lite2_substitutions():
    return [(LayerNorm, "layer_norm", lambda cell: DecomposedLayerNorm(cell.eps))]


def export_lite2_graph(spec, model, path: Path) -> List[str]:
    """Trace the static graph `spec` of `model` with the Lite 2.0 substitutions, convert it, write `path`
    -> the ops it converted."""
    net = spec.build(model)
    net.set_train(False)
    with tempfile.TemporaryDirectory() as scratch:
        traced = Path(scratch) / f"{spec.name}.mindir"
        with substituted(model, _lite2_substitutions()):
            export_graph(net, spec.name, spec.inputs, traced)
        data, ops = convert_mindir(traced.read_bytes(), spec.name)
    path.write_bytes(data)
    return ops


def device_assets(folder: Path, tokenizer, labels: Sequence[str], pre, graph_files: Mapping[str, str],
                  batch: int) -> Dict[str, str]:
    """Plain-text files a device app reads without a JSON or tokenizer library (lite/runner reads them):
    vocab.txt (token per line, line = id), labels.txt (answer per line) and preprocess.txt
    (`key value...` lines). -> {asset: file name}."""
    spec = json.loads(tokenizer.to_str())
    kind = spec["model"]["type"]
    if kind not in ("WordLevel", "WordPiece"):
        raise PackageError(f"tokenizer: a {kind} model; the device assets support WordLevel and WordPiece")
    vocab = spec["model"]["vocab"]
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    tokens = {**vocab, **added}
    by_id = [""] * (max(tokens.values()) + 1)
    for token, index in tokens.items():
        if "\n" in token:
            raise PackageError(f"tokenizer: token {token!r} holds a line break; it cannot go into vocab.txt")
        by_id[index] = token
    (folder / "vocab.txt").write_text("\n".join(by_id) + "\n", encoding="utf-8")
    (folder / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    lines = {
        "batch": [batch],
        "image_size": [pre.image_size],
        "image_mean": list(pre.image_mean),
        "image_std": list(pre.image_std),
        "max_text_length": [pre.max_text_length],
        "n_mels": [pre.n_mels],
        "max_audio_frames": [pre.max_audio_frames],
        "tokenizer": [kind.lower()],
        "lowercase": [1],
        "continuing_subword_prefix": [spec["model"].get("continuing_subword_prefix", "##")],
        "pad_id": [tokenizer.pad_id], "unk_id": [tokenizer.unk_id], "cls_id": [tokenizer.cls_id],
        "sep_id": [tokenizer.sep_id],
        **{f"graph_{name}": [file] for name, file in graph_files.items()},
    }
    (folder / "preprocess.txt").write_text("".join(f"{key} {' '.join(str(v) for v in values)}\n"
                                                   for key, values in lines.items()))
    return {"vocab": "vocab.txt", "labels": "labels.txt", "preprocess": "preprocess.txt"}


def write_lite2(work: Path, model, specs: Sequence, batch: int, tokenizer, labels: Sequence[str], pre) -> dict:
    """Fill the package folder `work`'s lite2/ with every graph of `specs` at static batch `batch` and the
    device assets -> the manifest's "lite2" entry. The graphs are checked later, against the samples of
    the package's own `<graph>_b<batch>` graphs, by `verify_package` when the runtime is available."""
    folder = work / FOLDER
    folder.mkdir()
    graphs = {}
    for spec in specs:
        static = spec.static(batch)
        file = f"{spec.name}.mindir"
        ops = export_lite2_graph(static, model, folder / file)
        graphs[spec.name] = {"file": f"{FOLDER}/{file}", "batch": batch, "reference": static.name, "ops": ops}
    assets = device_assets(folder, tokenizer, labels, pre, {n: g["file"] for n, g in graphs.items()}, batch)
    return {"mindir_version": LITE2_MINDIR_VERSION, "batch": batch, "graphs": graphs, "substituted": SUBSTITUTED,
            "device": {k: f"{FOLDER}/{v}" for k, v in assets.items()},
            "note": "static shapes: resize the batch on the device; run with any thread count"}
