"""A package's row of the comparison table, measured on its exported graphs (not on the Python model).

`evaluate_package` loads the MindIR graphs with nn.GraphCell and scores them on the test split of the
data set named in the package's config.json (or `data_root`): VQA accuracy (text and spoken
questions, answer classifier and generated answer), retrieval Recall@1 (image -> caption, speech ->
question) and the VQA graph's CPU latency. The row is stored as `evaluation.json` beside the
manifest (a measurement about the package, not part of it: not in the manifest's file list).
`comparison_table` lines rows up against the first package.
"""
import json
import os
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mindspore as ms
import numpy as np

from mindvl.config import config_from_dict
from mindvl.engine.decode_loop import generate
from mindvl.engine.native_prompts import NativeRequests
from mindvl.engine.package_graphs import SECTION, GenerationSpec, PackageGraphs, package_layout
from mindvl.engine.sampling import sampling_config
from mindvl.errors import PackageError
from mindvl.eval.retrieval import audio_to_text, image_to_caption
from mindvl.eval.vqa import score_vqa
from mindvl.package_reader import as_tuple, graph_caller, load_graph, load_samples, read_manifest
from mindvl.preprocess import preprocess_config

EVALUATION = "evaluation.json"
LATENCY_BATCHES = (1, 32)


def _latency_ms(graph, inputs: Dict[str, np.ndarray], batch: int, repeats: int) -> float:
    """Median wall time of one call at `batch` rows (the stored samples tiled), after a warm-up call."""
    tensors = [ms.Tensor(np.resize(v, (batch, *v.shape[1:]))) for v in inputs.values()]
    graph(*tensors)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = graph(*tensors)
        as_tuple(outputs)[0].asnumpy()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure_latency(package: Path, key: Optional[bytes] = None, repeats: int = 20, graph=None) -> Dict[str, float]:
    """{latency_ms_b<N>: median ms of one VQA graph call at batch N} for LATENCY_BATCHES, on this machine now."""
    manifest = read_manifest(package)
    graph = graph or load_graph(package, manifest, "vqa", key)
    samples, _ = load_samples(package, manifest, "vqa")
    return {f"latency_ms_b{batch}": round(_latency_ms(graph, samples, batch, repeats), 2) for batch in LATENCY_BATCHES}


class PackageGenerator:
    """A generative package's graphs (GraphCells) generating greedily, as GenerativeEvaluator asks a generator."""

    def __init__(self, package: Path, manifest: dict, key: Optional[bytes] = None, sizes: Sequence[int] = ()) -> None:
        """sizes: the batch sizes the graphs run at (DecodeBatch.sizes). Each size a graph meets compiles anew and
        keeps its working memory, an INT8 graph's dequantized weights included (vlm-s INT8 at five sizes: 23 GB,
        killed): evaluation pads every batch to one size."""
        self.sizes = tuple(sizes)
        spec = GenerationSpec.from_manifest(manifest)
        self.layout = package_layout(package, manifest)
        self.requests = NativeRequests(spec.native, preprocess_config(manifest["preprocess"])
                                       if "preprocess" in manifest else None) if spec.native else None
        self.chat = self.layout.chat
        wide = spec.runs_wide(max(self.sizes, default=0))  # else never run: not loaded
        self.graphs = PackageGraphs(spec, graph_caller({name: load_graph(package, manifest, name, key)  # a token a
                                                        for name in spec.graph_names(extend=False, wide=wide)}),
                                    extend=False, wide=wide)  # step

    def prompt(self, question: str, images=(), audio=None):
        """A native package's prompt (GenerativeEvaluator asks it of a native recipe's generator): decoded images
        cut at their own resolution as the server cuts a request's, a heard clip's (log-mel, frame mask)."""
        return self.requests.decoded(question, images, audio)

    def generate(self, prompts, max_new_tokens: int, **settings):
        return generate(self.layout, self.graphs, prompts, sampling_config(max_new_tokens=max_new_tokens, **settings),
                        self.sizes)

    def decode_ms(self, prompt, tokens: int = 32) -> float:
        """Milliseconds per decoded token of one sequence (batch 1): `tokens` tokens timed against one (the prefill
        and the first token), the fastest of three each (one timing of a small model's few milliseconds can be
        outlasted by a pause of the machine: a negative difference was seen), after a warm-up that compiles the
        graphs at batch 1."""
        def once(count: int) -> float:
            start = time.perf_counter()
            generate(self.layout, self.graphs, [prompt],
                     sampling_config(max_new_tokens=count, ignore_eos=True))  # batch 1 exactly
            return time.perf_counter() - start

        once(2)  # compiles the graphs at batch 1
        timed = [min(once(count) for _ in range(3)) for count in (1, tokens)]
        return round((timed[1] - timed[0]) / (tokens - 1) * 1000, 2)


def evaluate_generative_package(package: Path, manifest: dict, cfg, key: Optional[bytes] = None,
                                progress: bool = True, limit: int = 0) -> dict:
    """A generative package's row: its generated answers to the test split's typed and spoken questions (the first
    `limit` of each; 0: all) through its MindIR graphs, its size on disk and its decode speed at batch 1. A native
    package answers a question at a time (its images at their own sizes need not fit one vision graph together)."""
    from mindvl.eval.generated_answers import BATCH, LARGE_DECODER, LARGE_DECODER_BATCH, GenerativeEvaluator

    batch = LARGE_DECODER_BATCH if manifest["parameters"] > LARGE_DECODER else BATCH  # as the framework's evaluation
    if manifest[SECTION].get("native"):  # its vision graphs hold a bounded number of patches: a question at a time
        batch = 1
    generator = PackageGenerator(package, manifest, key, sizes=(batch,))
    evaluator = GenerativeEvaluator(cfg, batch_size=batch, generator=generator)
    report = evaluator.evaluate("test", captions=False, progress=progress, limit=limit)
    prompt = evaluator.questions("test", 1)[0][1]
    return {"package": str(package), "name": manifest["name"], "kind": "generative",
            "compression": manifest["compression"]["method"], "parameters": manifest["parameters"],
            "package_bytes": sum(entry["bytes"] for name, entry in manifest["files"].items()
                                 if not name.startswith("samples/")),
            "cpu_threads": os.cpu_count(), "decode_ms_b1": generator.decode_ms(prompt),
            "vqa_text": report["vqa_text"]["accuracy"], "vqa_audio": report["vqa_audio"]["accuracy"],
            "questions": report["vqa_text"]["count"] + report["vqa_audio"]["count"]}


def evaluate_package(package: Path, data_root: Optional[str] = None, key: Optional[bytes] = None,
                     progress: bool = True, repeats: int = 20, limit: int = 0) -> dict:
    """The package's comparison row (also written to <package>/evaluation.json); `limit`: a generative package's
    questions of each kind (0: all)."""
    package = Path(package)
    manifest = read_manifest(package)
    if not (package / "config.json").is_file():
        raise PackageError(f"{package}: no config.json, so no data set to evaluate on (a converted VLM's package); "
                           f"evaluate the package of a run trained from it")
    cfg = config_from_dict(json.loads((package / "config.json").read_text()))
    if data_root:
        cfg.data.root = data_root
    if SECTION in manifest:
        row = evaluate_generative_package(package, manifest, cfg, key, progress, limit)
        (package / EVALUATION).write_text(json.dumps(row, indent=2))
        return row
    vqa = load_graph(package, manifest, "vqa", key)
    names = [t["name"] for t in manifest["graphs"]["vqa"]["inputs"]]

    def predict(batch):
        logits, ids = vqa(*(ms.Tensor(batch[name]) for name in names))
        return logits.asnumpy().argmax(-1), ids.asnumpy()

    row = {"package": str(package), "name": manifest["name"], "compression": manifest["compression"]["method"],
           "parameters": manifest["parameters"],
           "graph_bytes": sum(package.joinpath(g["file"]).stat().st_size
                              for g in manifest["graphs"].values() if g["batch"] == "dynamic"),
           "cpu_threads": os.cpu_count()}
    row.update(measure_latency(package, key, repeats, vqa))
    for modality in ("text", "audio"):
        result = score_vqa(cfg, predict, modality, progress)
        row[f"vqa_{modality}"] = result["accuracy"]
        row[f"vqa_{modality}_generated"] = result["generated_accuracy"]
    text_net = load_graph(package, manifest, "text_embed", key)
    row["image_to_caption_r1"] = image_to_caption(cfg, load_graph(package, manifest, "image_embed", key),
                                                  text_net)["R@1"]
    row["audio_to_text_r1"] = audio_to_text(cfg, load_graph(package, manifest, "audio_embed", key), text_net)["R@1"]
    (package / EVALUATION).write_text(json.dumps(row, indent=2))
    return row


def read_evaluation(package: Path) -> dict:
    path = Path(package) / EVALUATION
    if not path.is_file():
        raise PackageError(f"{path}: missing; run `mindvl export evaluate {package}` first")
    return json.loads(path.read_text())


# each kind's columns after package, compression and parameters: (header, the cell from a row with its "kept")
CLASSIFIER_COLUMNS = (
    ("graph MB", lambda r: f"{r['graph_bytes'] / 1e6:.2f}"),
    ("latency b1 / b32 (ms)", lambda r: f"{r['latency_ms_b1']:.1f} / {r['latency_ms_b32']:.1f}"),
    ("VQA text", lambda r: f"{r['vqa_text']:.1%}"), ("VQA audio", lambda r: f"{r['vqa_audio']:.1%}"),
    ("VQA kept", lambda r: f"{r['kept']:.1%}"), ("image->caption R@1", lambda r: f"{r['image_to_caption_r1']:.1%}"),
    ("speech->question R@1", lambda r: f"{r['audio_to_text_r1']:.1%}"))
GENERATIVE_COLUMNS = (
    ("package MB", lambda r: f"{r['package_bytes'] / 1e6:.2f}"),
    ("decode ms/token b1", lambda r: f"{r['decode_ms_b1']:.2f}"),
    ("VQA typed", lambda r: f"{r['vqa_text']:.1%}"), ("VQA spoken", lambda r: f"{r['vqa_audio']:.1%}"),
    ("VQA kept", lambda r: f"{r['kept']:.1%}"))


def comparison_table(packages: Sequence[Path]) -> str:
    """Markdown table of the packages' evaluation rows; "VQA kept" is relative to the first package. Generative
    packages get their own columns (generated answers, decode speed); the two kinds do not mix in one table."""
    rows: List[dict] = [read_evaluation(p) for p in packages]
    kinds = {row.get("kind", "classifier") for row in rows}
    if len(kinds) > 1:
        raise PackageError("export compare: give either classifier packages or generative ones, not both")
    columns = GENERATIVE_COLUMNS if kinds == {"generative"} else CLASSIFIER_COLUMNS
    header = "| package | compression | parameters | " + " | ".join(name for name, _ in columns) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    base = rows[0]
    for package, row in zip(packages, rows):
        row = {**row, "kept": (row["vqa_text"] + row["vqa_audio"]) / max(base["vqa_text"] + base["vqa_audio"], 1e-9)}
        lines.append(f"| {Path(package).name} | {row['compression']} | {row['parameters']:,} | "
                     + " | ".join(cell(row) for _, cell in columns) + " |")
    return "\n".join(lines)
