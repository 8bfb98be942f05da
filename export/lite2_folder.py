"""The package's lite2/ folder: every graph traced for the MindSpore Lite 2.0 runtime and down-converted
(export/lite2_mindir.py), plus the plain-text device assets the C++ runner reads.

Lite 2.0 needs static shapes (a `None` batch dimension does not build; a static export plus
`Model.Resize` works), its LayerNorm kernel returns wrong rows for batch index >= 1 on more than one
thread, and its Rsqrt, Cos and GeLU kernels are approximations (measured: Rsqrt relative error 5.7e-5 on
[0.01, 30], Cos absolute error 1.8e-3 on [0.01, 30], GeLU 4.7e-4 on [-6, 6], while Sin, Sqrt, Pow, Exp,
Erf, Sigmoid and Softmax are exact to float32 rounding). So the lite2 export traces the model with
LayerNorm decomposed into standard ops (cells/portable.py), RMSNorm's Rsqrt as Pow(x, -0.5), the rotary
embeddings' Cos from Sin (HalfAngleCos) and the tanh GELU from Exp (ExpTanhGELU), and passes the other
graphs' standard ops through unchanged: a small decoder's greedy tokens then come out as the framework's.

A generative package's lite2/ holds its attachments, prefill and decode graphs at batch 1 (the device
generates one sequence at a time) and generation.txt, the generation spec and the chat template as token
ids. Lite 2.0 reads MindIR external data, so those graphs keep no weights of their own: their parameters
point into the package's weights.bin (`../weights.bin`), the one copy the standard graphs share. Its decoder's
vocabulary reaches the C++ runner as vocab.txt (a word vocabulary: vlm-tiny's) or as the converted decoder's
SentencePiece model, tokenizer.model (Gemma's), which libsentencepiece reads; the export first checks that the
model reads the stored questions and PARITY_TEXTS as the package's tokenizer.json does. A byte-level BPE decoder
(Qwen's) has no such form: its lite2/ serves the Python device pipeline alone, which reads tokenizer.json.
"""
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from safetensors.numpy import save_file

from mindvl.cells.activation import GELUTanh
from mindvl.cells.attention import MultiHeadAttention
from mindvl.cells.norm import LayerNorm, StandardRMSNorm
from mindvl.cells.portable import DecomposedLayerNorm, PowRsqrt, substituted
from mindvl.cells.rotary import AxialRotary, Rotary
from mindvl.errors import PackageError
from mindvl.export.graphs import export_graph
from mindvl.export.lite2_mindir import LITE2_MINDIR_VERSION, convert_mindir
from mindvl.export.shared_weights import external_bytes
from mindvl.mindir import parse
from mindvl.package_reader import as_tuple
from mindvl.preprocess import TextTokenizer

FOLDER = "lite2"  # inside the package: the converted graphs and the device assets
SUBSTITUTED = {"LayerNorm": "ReduceMean, Sub, Mul, Add, Sqrt, RealDiv (Lite 2.0's LayerNorm is wrong on >1 thread)",
               "Rsqrt": "Pow(x, -0.5) in RMSNorm (Lite 2.0's Rsqrt: relative error 5.7e-5)",
               "Cos": "1 - 2 sin(x/2)^2 in the rotary embeddings (Lite 2.0's Cos: absolute error 1.8e-3)",
               "GeLU": "x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))) (Lite 2.0's GeLU: absolute error 4.7e-4)"}
GELU_TANH_SCALE = -2.0 * math.sqrt(2.0 / math.pi)


class HalfAngleCos(nn.Cell):
    """cos(x) as 1 - 2 sin(x/2)^2: Lite 2.0's Sin is exact to float32 rounding and halving is exact, so this
    is within 2e-7 of cos for |x| <= 300 on Lite 2.0, whose own Cos kernel is off by up to 1.8e-3. (A
    portable formulation like those of cells/portable.py, needed by this target only.)"""

    def __init__(self):
        super().__init__()
        self.sin = ops.Sin()
        self.mul = ops.Mul()
        self.sub = ops.Sub()

    def construct(self, x):
        half = self.sin(self.mul(x, 0.5))
        return self.sub(1.0, self.mul(self.mul(half, half), 2.0))


class ExpTanhGELU(nn.Cell):
    """MindSpore's GeLU (the tanh approximation, 0.5 x (1 + tanh(z))) as x * sigmoid(2 z) = x / (1 + exp(-2 z)),
    z = sqrt(2/pi) (x + 0.044715 x^3): within 4.8e-7 of it on Lite 2.0, whose GeLU kernel is off by 4.7e-4."""

    def __init__(self):
        super().__init__()
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.exp = ops.Exp()
        self.div = ops.RealDiv()

    def construct(self, x):
        cubic = self.add(x, self.mul(self.mul(self.mul(x, x), x), 0.044715))
        return self.div(x, self.add(self.exp(self.mul(cubic, GELU_TANH_SCALE)), 1.0))


def _broadcast_shape(*shapes) -> tuple:
    """numpy's broadcast of static shapes (a constant while a graph is traced)."""
    rank = max(len(shape) for shape in shapes)
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in shapes]
    return tuple(max(dims) for dims in zip(*padded))


class BroadcastSelect(nn.Cell):
    """Select(condition, x, y) with the three broadcast to one shape first: Lite 2.0's Where (what Select
    becomes) does not broadcast, so the decode graph's cache write (a (batch, cache_len, 1) slot choosing
    between (batch, 1, width) and (batch, cache_len, width)) fails its shape inference."""

    def __init__(self):
        super().__init__()
        self.select = ops.Select()

    def construct(self, condition, x, y):
        shape = _broadcast_shape(condition.shape, x.shape, y.shape)
        return self.select(ops.broadcast_to(condition, shape), ops.broadcast_to(x, shape), ops.broadcast_to(y, shape))


class SelectRows(nn.Cell):
    """TensorScatterUpdate(cache, at, new) of one step a row (at (batch, 1, 2): each row's (row, slot)) as the
    Select over the whole cache it replaced: Lite 2.0 cannot build TensorScatterUpdate."""

    def __init__(self):
        super().__init__()
        self.select = BroadcastSelect()

    def construct(self, cache, at, new):
        slots = ops.arange(cache.shape[1]).reshape(1, cache.shape[1], 1)
        return self.select(slots == at[:, :, 1:2].reshape(at.shape[0], 1, 1), new, cache)


def _lite2_substitutions():
    return [(LayerNorm, "layer_norm", lambda cell: DecomposedLayerNorm(cell.eps)),
            (StandardRMSNorm, "rsqrt", lambda cell: PowRsqrt()),
            (Rotary, "cos", lambda cell: HalfAngleCos()),
            (AxialRotary, "cos", lambda cell: HalfAngleCos()),
            (GELUTanh, "gelu", lambda cell: ExpTanhGELU()),
            (MultiHeadAttention, "select", lambda cell: BroadcastSelect()),
            (MultiHeadAttention, "write_rows", lambda cell: SelectRows())]


def export_lite2_graph(spec, model, path: Path) -> List[str]:
    """Trace the static graph `spec` of `model` with the Lite 2.0 substitutions, convert it, write `path`
    -> the ops it converted."""
    net = spec.build(model)
    net.set_train(False)
    with tempfile.TemporaryDirectory() as scratch:
        traced = Path(scratch) / path.name
        with substituted(model, _lite2_substitutions()):
            export_graph(net, spec.name, spec.inputs, traced)
        data, converted = convert_mindir(traced.read_bytes(), spec.name)
        variables = traced.with_name(f"{traced.stem}_variables")
        if variables.is_dir():  # over 1 GB MindSpore keeps the weights there; the graph names them relative to itself
            shutil.move(str(variables), str(path.with_name(variables.name)))
    path.write_bytes(data)
    return converted


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
    if labels:  # a generative package answers in words: no labels
        (folder / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    _write_preprocess(folder, pre, batch, graph_files, {
        "tokenizer": [kind.lower()],
        "lowercase": [1],
        "continuing_subword_prefix": [spec["model"].get("continuing_subword_prefix", "##")],
        "pad_id": [tokenizer.pad_id], "unk_id": [tokenizer.unk_id], "cls_id": [tokenizer.cls_id],
        "sep_id": [tokenizer.sep_id]})
    return {"vocab": "vocab.txt", **({"labels": "labels.txt"} if labels else {}), "preprocess": "preprocess.txt"}


def _write_preprocess(folder: Path, pre, batch: int, graph_files: Mapping[str, str], tokenizer: Mapping) -> None:
    """preprocess.txt: the preprocessing parameters, the `tokenizer` lines and each graph's file."""
    _write_lines(folder / "preprocess.txt", {
        "batch": [batch], "image_size": [pre.image_size], "image_mean": list(pre.image_mean),
        "image_std": list(pre.image_std), "max_text_length": [pre.max_text_length], "n_mels": [pre.n_mels],
        "max_audio_frames": [pre.max_audio_frames], **tokenizer,
        **{f"graph_{name}": [file] for name, file in graph_files.items()}})


TOKENIZER_MODEL = "tokenizer.model"  # lite2/: a SentencePiece package's vocabulary, as the runner reads it
# Texts a SentencePiece package's model must read as its tokenizer.json does, besides the stored questions:
# Unicode, runs of whitespace, turn markers and a special token typed as text (the chat reads it as characters).
PARITY_TEXTS = ("What colour is the shape in the image?", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 \u00bd",
                "two  spaces,   three, \ttab and\nnew line\n\n", "<start_of_turn>user\nhi<end_of_turn>\n",
                "typed <bos> and [EOS] and <|im_end|>", " leading and trailing ", "2026-12-07: 3.14!")


def sentencepiece_assets(folder: Path, model_file: Path, chat, texts: Sequence[str], pre,
                         graph_files: Mapping[str, str]) -> Dict[str, str]:
    """The device assets of a decoder with a SentencePiece vocabulary: `model_file` (the converted decoder's
    tokenizer.model) as lite2/tokenizer.model and preprocess.txt saying so -> {asset: file name}. Refused, naming
    the text, unless the model reads every special token, each of `texts` and PARITY_TEXTS (cut as the chat cuts a
    user's text) and their decoding as `chat.tokenizer` (the package's tokenizer.json) does."""
    import sentencepiece

    from mindvl.preprocess.sentencepiece_vocab import SPACE

    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    tokenizer, size = chat.tokenizer, processor.get_piece_size()
    fix = ("convert the decoder again with `mindvl convert llm`, or leave --target lite2 out (the Python device "
           "pipeline reads tokenizer.json)")
    for index, token in tokenizer.get_added_tokens_decoder().items():
        if token.special and (index >= size or processor.id_to_piece(index).replace(SPACE, " ") != token.content):
            raise PackageError(f"{model_file}: special token {index} ({token.content!r}) is not the same piece in "
                               f"the SentencePiece model; {fix}")
    for text in (*PARITY_TEXTS, *texts):
        ids = []
        for piece in chat.literal_pieces(text):
            ours, theirs = processor.encode(piece), tokenizer.encode(piece, add_special_tokens=False).ids
            if ours != theirs:
                raise PackageError(f"{model_file}: reads {piece!r} as {ours}, tokenizer.json as {theirs}; the device "
                                   f"would prompt the model differently; {fix}")
            ids += ours
        if processor.decode(ids) != tokenizer.decode(ids, skip_special_tokens=True):
            raise PackageError(f"{model_file}: decodes the ids of {text!r} as {processor.decode(ids)!r}, "
                               f"tokenizer.json as {tokenizer.decode(ids, skip_special_tokens=True)!r}; {fix}")
    shutil.copyfile(model_file, folder / TOKENIZER_MODEL)
    _write_preprocess(folder, pre, GENERATIVE_BATCH, graph_files,
                      {"tokenizer": ["sentencepiece"], "tokenizer_model": [TOKENIZER_MODEL]})
    return {"tokenizer_model": TOKENIZER_MODEL, "preprocess": "preprocess.txt"}


def _write_lines(path: Path, lines: Mapping[str, Sequence]) -> None:
    """`key value...` lines (a key alone when it has no values), the form lite/runner/assets.cc reads."""
    path.write_text("".join(" ".join([key, *(str(v) for v in values)]) + "\n" for key, values in lines.items()))


def _export_graphs(folder: Path, model, specs: Sequence, batch: int) -> Dict[str, dict]:
    """Every graph of `specs` at static batch `batch` into `folder` -> their manifest entries, each naming the
    package graph `<graph>_b<batch>` whose stored samples verify it."""
    graphs = {}
    for spec in specs:
        static = spec.static(batch)
        file = f"{spec.name}.mindir"
        ops = export_lite2_graph(static, model, folder / file)
        graphs[spec.name] = {"file": f"{FOLDER}/{file}", "batch": batch, "reference": static.name, "ops": ops}
    return graphs


def write_lite2(work: Path, model, specs: Sequence, batch: int, tokenizer, labels: Sequence[str], pre) -> dict:
    """Fill the package folder `work`'s lite2/ with every graph of `specs` at static batch `batch` and the
    device assets -> the manifest's "lite2" entry. The graphs are checked later, against the samples of
    the package's own `<graph>_b<batch>` graphs, by `verify_package` when the runtime is available."""
    folder = work / FOLDER
    folder.mkdir()
    graphs = _export_graphs(folder, model, specs, batch)
    assets = device_assets(folder, tokenizer, labels, pre, {n: g["file"] for n, g in graphs.items()}, batch)
    return {"mindir_version": LITE2_MINDIR_VERSION, "batch": batch, "graphs": graphs, "substituted": SUBSTITUTED,
            "device": {k: f"{FOLDER}/{v}" for k, v in assets.items()},
            "note": "static shapes: resize the batch on the device; run with any thread count"}


# ----------------------------------------------------------------------------- generative packages

GENERATIVE_BATCH = 1  # the device generates one sequence at a time; Lite 2.0 builds no dynamic batch


def wants_generation_lite2(lite2_batch, package: str) -> bool:
    """Whether a generation package (`package`: what kind, for the message) gets lite2/: `lite2_batch` None (no
    --target lite2) or GENERATIVE_BATCH; any other batch is refused by name."""
    if lite2_batch not in (None, GENERATIVE_BATCH):
        raise PackageError(f"--lite2-batch {lite2_batch}: a {package} package's lite2 graphs have batch "
                           f"{GENERATIVE_BATCH} (the device generates one sequence at a time; the rows of a batch run "
                           f"in turn); leave --lite2-batch out")
    return lite2_batch is not None
TEMPLATE_PARTS = ("bos", "user", "assistant", "end", "image_open", "image_close", "audio_open", "audio_close")


def point_into_weights(work: Path, files: Sequence[str], weights: str = "weights.bin") -> Dict[str, int]:
    """Make the parameters of `files` (MindIR files under `work`, weights inline or, over 1 GB, in MindSpore's own
    `<graph>_variables/`, removed after) external data in the package's `weights` file, which must already hold
    each of them under its name with the same bytes (one model's graphs: export/shared_weights.py wrote it)
    -> {"inline_bytes": the files before, "bytes": after}."""
    index: Dict[str, tuple] = {}
    for graph in sorted(p for p in work.glob("*.mindir")):  # the package's own graphs: where each parameter is
        for proto in parse(graph.read_bytes()).graph.parameter:
            if proto.HasField("external_data") and proto.external_data.location == weights:
                index[proto.name[proto.name.find(":") + 1:]] = (proto.external_data.offset, proto.external_data.length)
    stored = (work / weights).read_bytes()
    split = [(work / f).with_name(f"{Path(f).stem}_variables") for f in files]  # MindSpore's own (over 1 GB)
    before = sum(p.stat().st_size for f, folder in zip(files, split) for p in [work / f, *folder.glob("*")])
    for file in files:
        model = parse((work / file).read_bytes())
        location = "../" * (len(Path(file).parts) - 1) + weights  # relative to the MindIR's own folder
        split_files: Dict[str, bytes] = {}
        for proto in model.graph.parameter:
            name = proto.name[proto.name.find(":") + 1:]
            offset, length = index.get(name, (0, 0))
            data = (external_bytes((work / file).parent, proto.external_data, split_files)
                    if proto.HasField("external_data") else proto.raw_data)
            if name not in index or stored[offset:offset + length] != data:
                raise PackageError(f"{file}: parameter {name} is not in {weights} with the same bytes; the lite2 "
                                   f"graphs must come from the model the package's graphs were exported from")
            proto.ClearField("raw_data")
            proto.external_data.location = location
            proto.external_data.offset = offset
            proto.external_data.length = length
        (work / file).write_bytes(model.SerializeToString())
    for folder in split:
        shutil.rmtree(folder, ignore_errors=True)
    return {"inline_bytes": before, "bytes": sum((work / f).stat().st_size for f in files)}


def generation_assets(folder: Path, spec, chat) -> str:
    """generation.txt: the generation spec and the chat template as token ids (the runner has no tokenizer
    for control tokens), `key value...` lines -> its file name."""
    template = chat.template
    lines = {
        "cache_len": [spec.cache_len], "buckets": spec.buckets, "layers": [spec.layers],
        "vocab_size": [spec.vocab_size], "width": [spec.width], "kv_width": [spec.kv_width],
        "image_tokens": [spec.image_tokens], "audio_tokens": [spec.audio_tokens], "pad_id": [spec.pad_id],
        "stop_ids": spec.stop_ids, "max_new_tokens": [spec.max_new_tokens],
        "special_ids": sorted(i for i, t in chat.tokenizer.get_added_tokens_decoder().items() if t.special),
        "template": [template.name],
        **{part: chat.tokenizer.encode(getattr(template, part), add_special_tokens=False).ids
           if getattr(template, part) else [] for part in TEMPLATE_PARTS},
    }
    _write_lines(folder / "generation.txt", lines)
    return "generation.txt"


def _write_samples(work: Path, spec, net, inputs: Sequence[np.ndarray]) -> str:
    """Store `inputs` of graph `spec` (static) with the framework's outputs as samples/lite2_<graph>.safetensors,
    the tensors named as a package graph's samples (load_samples reads them) -> the file, relative to `work`."""
    net.set_train(False)
    outputs = as_tuple(net(*(ms.Tensor(value) for value in inputs)))
    file = f"samples/{FOLDER}_{spec.name}.safetensors"
    save_file({**{f"input.{t.name}": np.ascontiguousarray(v) for t, v in zip(spec.inputs, inputs)},
               **{f"output.{t.name}": np.ascontiguousarray(o.asnumpy()) for t, o in zip(spec.outputs, outputs)}},
              str(work / file))
    return file


def write_generative_lite2(work: Path, model, samples: Sequence[Tuple], spec, chat, pre,
                           sentencepiece: Optional[Path] = None, texts: Sequence[str] = ()) -> dict:
    """Fill the generative package folder `work` (its graphs and weights.bin written) with lite2/: the
    generation graphs at batch 1, their parameters pointing into weights.bin, and the device assets
    (preprocess.txt, generation.txt, and vocab.txt or tokenizer.model) -> the manifest's "lite2" entry. `samples`:
    (GraphSpec, its sample inputs at batch 1 from real questions) for each generation graph, stored with the
    framework's outputs: a prefill graph's slot_index addresses the modality rows of its whole batch, so the package
    graphs' multi-row samples cannot run one row at a time. `spec`: the package's GenerationSpec; `chat`: its
    ChatEncoder; `sentencepiece`: the decoder's SentencePiece model where its tokenizer is not a word vocabulary
    (None: none, so no runner assets: the Python device pipeline alone); `texts`: the stored questions, which the
    model must read as tokenizer.json does. `verify_package` runs the graphs on those samples and generates the
    stored questions again on Lite 2.0 (and in the C++ runner) when the runtime is available."""
    kind = json.loads(chat.tokenizer.to_str())["model"]["type"]
    words = kind in ("WordLevel", "WordPiece")
    if not words and sentencepiece is None:
        return _python_only_lite2(work, model, samples, f"a {kind} model without one")

    def assets(folder: Path, graphs: Mapping[str, dict]) -> Dict[str, str]:
        files = {n: g["file"] for n, g in graphs.items()}
        found = (device_assets(folder, TextTokenizer(chat.tokenizer), [], pre, files, GENERATIVE_BATCH) if words else
                 sentencepiece_assets(folder, sentencepiece, chat, texts, pre, files))
        return {**found, "generation": generation_assets(folder, spec, chat)}

    return {**_generation_lite2(work, model, samples, assets),
            "chat_template": {part: getattr(chat.template, part) for part in (*TEMPLATE_PARTS, "stop")}}


def write_native_lite2(work: Path, model, samples: Sequence[Tuple]) -> dict:
    """lite2/ for a native-resolution VLM's package (export/native_prefill_decode.py): its vision, prefill and
    decode graphs at batch 1 as write_generative_lite2 writes a generative package's, for the Python device pipeline
    (mindvl.lite.DevicePipeline), which tokenises with the package's tokenizer.json. No plain-text device assets:
    the C++ runner reads a word vocabulary or a SentencePiece model, and the family's tokenizer is byte-level BPE."""
    return _python_only_lite2(work, model, samples, "byte-level BPE")


def _python_only_lite2(work: Path, model, samples: Sequence[Tuple], tokenizer: str) -> dict:
    """lite2/ without the runner's device assets (the Python device pipeline reads tokenizer.json), the manifest
    entry saying why: the decoder's tokenizer is `tokenizer`."""
    return {**_generation_lite2(work, model, samples, lambda folder, graphs: {}),
            "runner": f"the C++ runner reads a word vocabulary or a SentencePiece model; this package's tokenizer is "
                      f"{tokenizer}: generate with the Python device pipeline"}


def _generation_lite2(work: Path, model, samples: Sequence[Tuple], assets: Callable) -> dict:
    """lite2/ of a generation package: each graph of `samples` ((GraphSpec, its batch-1 sample inputs)) at batch 1,
    stored with the framework's outputs on those inputs, its parameters pointing into weights.bin; `assets(folder,
    graphs)` writes the device's files -> the manifest's "lite2" entry."""
    folder = work / FOLDER
    folder.mkdir()
    graphs = _export_graphs(folder, model, [graph for graph, _ in samples], GENERATIVE_BATCH)
    for graph, inputs in samples:
        static = graph.static(GENERATIVE_BATCH)
        graphs[graph.name].update(reference=graph.name, inputs=[t.to_dict() for t in static.inputs],
                                  outputs=[t.to_dict() for t in static.outputs],
                                  samples=_write_samples(work, static, graph.build(model), inputs))
    sizes = point_into_weights(work, [g["file"] for g in graphs.values()])
    device = assets(folder, graphs)
    return {"mindir_version": LITE2_MINDIR_VERSION, "batch": GENERATIVE_BATCH, "graphs": graphs,
            "substituted": SUBSTITUTED, "weights": {"file": "weights.bin", **sizes},
            "device": {k: f"{FOLDER}/{v}" for k, v in device.items()},
            "note": "batch 1, static shapes; the parameters are external data in ../weights.bin; run with any "
                    "thread count"}
