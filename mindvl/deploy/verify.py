"""`mindvl export verify`: does the package still compute what the checkpoint computed?

Every listed file's sha256, then every graph loaded back with `mindspore.load` + `nn.GraphCell` (no
Python model code) and run on the stored samples; each output is compared with the output the
framework computed at export time: floats within |got - expected| <= atol + rtol * |expected|
(manifest "tolerance", 1e-4 and 1e-4), integer outputs (generated token ids) exactly. A package with
lite2/ graphs also runs each of them on the MindSpore Lite 2.0 runtime with 2 threads against the
samples of its `<graph>_b<N>` reference (a generative package's lite2 graphs: their own batch-1 samples)
and generates the stored questions again there and in the C++ runner (lite/runner, from the device assets),
or says why it could not (the runtime is fetched and the runner built on first use).
"""
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

import mindspore as ms
import numpy as np

from mindvl.errors import PackageError
from mindvl.package_reader import as_tuple, check_files, graph_caller, load_graph, load_samples, read_manifest


@dataclass
class OutputCheck:
    graph: str
    output: str
    max_abs_diff: float
    mismatched: int  # elements outside the tolerance
    ok: bool


@dataclass
class VerifyReport:
    package: str
    files: int
    checks: List[OutputCheck] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what was not checked, and why

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failures(self) -> List[OutputCheck]:
        return [check for check in self.checks if not check.ok]

    def to_dict(self) -> dict:
        return {"package": self.package, "ok": self.ok, "files": self.files,
                "checks": [asdict(check) for check in self.checks], "notes": self.notes}

    def summary(self) -> str:
        lines = [f"{self.package}: {self.files} files match their sha256"]
        for check in self.checks:
            state = "ok" if check.ok else f"MISMATCH ({check.mismatched} elements outside the tolerance)"
            lines.append(f"  {check.graph:<16} {check.output:<16} max |diff| {check.max_abs_diff:.2e}  {state}")
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("verified: every graph computes its stored outputs" if self.ok else
                     "FAILED: " + "; ".join(f"graph {c.graph} output {c.output}" for c in self.failures()))
        return "\n".join(lines)


def compare(graph: str, output: str, got: np.ndarray, expected: np.ndarray, tolerance: dict) -> OutputCheck:
    if got.shape != expected.shape:
        return OutputCheck(graph, output, float("inf"), int(expected.size), False)
    if np.issubdtype(expected.dtype, np.integer):
        bad = got != expected
        diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    else:
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        bad = ~(diff <= tolerance["atol"] + tolerance["rtol"] * np.abs(expected))  # NaN counts as bad
    return OutputCheck(graph, output, float(diff.max()) if diff.size else 0.0, int(bad.sum()), not bad.any())


def verify_package(package: Path, key: Optional[bytes] = None) -> VerifyReport:
    """Hashes, loading and stored samples of every graph; PackageError for a package that cannot be read."""
    package = Path(package)
    manifest = read_manifest(package)
    check_files(package, manifest)
    report = VerifyReport(str(package), len(manifest["files"]))
    for name, entry in manifest["graphs"].items():
        graph = load_graph(package, manifest, name, key)
        inputs, expected = load_samples(package, manifest, name)
        try:
            outputs = as_tuple(graph(*(ms.Tensor(value) for value in inputs.values())))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise PackageError(f"graph {name} ({entry['file']}): running the stored samples failed: "
                               f"{str(exc).strip().splitlines()[0]}") from exc
        for (output, want), got in zip(expected.items(), outputs):
            report.checks.append(compare(name, output, got.asnumpy(), want, manifest["tolerance"]))
    if manifest.get("lite2"):
        _verify_lite2(package, manifest, report)
    if manifest.get("generation_samples"):
        _verify_generation(package, manifest, report, key)
    return report


def _verify_generation(package: Path, manifest: dict, report: VerifyReport, key: Optional[bytes]) -> None:
    """The stored questions generated again through the graphs (greedy): the framework's tokens, exactly."""
    from mindvl.engine.package_graphs import GenerationSpec

    spec = GenerationSpec.from_manifest(manifest)
    graphs = {name: load_graph(package, manifest, name, key) for name in spec.graph_names()}
    _check_generation(package, manifest, report, graph_caller(graphs), "generate")


def _check_generation(package: Path, manifest: dict, report: VerifyReport, run, graph: str,
                      one_at_a_time: bool = False) -> None:
    """The stored questions generated through `run(name, inputs)` (any runtime's graphs), greedy, checked
    against the framework's tokens as `graph`'s outputs; together, or `one_at_a_time` (graphs of batch 1)."""
    from mindvl.engine.decode_loop import generate
    from mindvl.engine.package_graphs import GenerationSpec, PackageGraphs, package_layout
    from mindvl.engine.sampling import sampling_config

    graphs = PackageGraphs(GenerationSpec.from_manifest(manifest), run)
    layout = package_layout(package, manifest)
    samples = manifest["generation_samples"]
    prompts = stored_prompts(package, manifest)
    settings = sampling_config(max_new_tokens=samples["max_new_tokens"])
    generated = ([generate(layout, graphs, [prompt], settings)[0] for prompt in prompts]
                 if one_at_a_time else generate(layout, graphs, prompts, settings))
    for index, (stored, generation) in enumerate(zip(samples["prompts"], generated)):
        want = np.asarray(stored["tokens"], np.int64)
        got = np.asarray(generation.tokens, np.int64)
        report.checks.append(compare(graph, f"sample {index} tokens", got, want, manifest["tolerance"]))


def stored_prompts(package: Path, manifest: dict) -> list:
    """The generation samples' prompts: MultimodalPrompts (question, image, log-mel), or a native package's
    NativePrompts (question, each attachment's patches, grid, kind and time step, and a clip's log-mel)."""
    from safetensors.numpy import load_file

    from mindvl.engine.native_prompts import NativePrompt
    from mindvl.engine.prompts import MultimodalPrompt

    samples = manifest["generation_samples"]
    check_files(package, manifest, [samples["file"]])
    arrays = load_file(str(Path(package) / samples["file"]))
    return [NativePrompt(p["question"], [(a["kind"], arrays[f"{i}.{k}.patches"], arrays[f"{i}.{k}.grid"], a["time_step"])
                                         for k, a in enumerate(p["attachments"])],
                         audio=(arrays[f"{i}.mel"], arrays[f"{i}.frame_mask"]) if p.get("audio") else None)
            if "attachments" in p else
            MultimodalPrompt(p["question"], arrays.get(f"{i}.image"), arrays.get(f"{i}.mel"),
                             arrays.get(f"{i}.frame_mask")) for i, p in enumerate(samples["prompts"])]


LITE2_VERIFY_THREADS = 2  # more than one: the case Lite 2.0's own LayerNorm got wrong


def _verify_lite2(package: Path, manifest: dict, report: VerifyReport) -> None:
    """Each lite2 graph on its reference's samples (in chunks of its static batch); a generative package's
    stored questions generated again on Lite 2.0, greedy: the framework's tokens, exactly."""
    from mindvl.lite import lite2_runtime
    from mindvl.lite.lite_model import Context, GenerationGraphs, LiteError, LiteModel

    reason = lite2_runtime.status()
    if reason:
        report.notes.append(f"lite2 graphs not run: {reason}")
        return
    context = Context(LITE2_VERIFY_THREADS)
    own = {**manifest, "graphs": manifest["lite2"]["graphs"]}  # entries with samples of their own, at their batch
    for name, entry in manifest["lite2"]["graphs"].items():
        inputs, expected = (load_samples(package, own, name) if "samples" in entry else
                            load_samples(package, manifest, entry["reference"]))
        try:
            with LiteModel.from_package(package, name, context, backend="lite2") as model:
                outputs = list(model.run(list(inputs.values())).values())
        except LiteError as exc:
            raise PackageError(f"lite2 graph {name} ({entry['file']}): {exc}") from exc
        for (output, want), got in zip(expected.items(), outputs):
            got, want = _attended(name, output, inputs, got, want)
            report.checks.append(compare(f"lite2/{name}", output, got, want, _scaled(manifest["tolerance"], want)))
    if manifest.get("generation_samples"):
        try:
            with GenerationGraphs(package, "lite2", context) as graphs:
                _check_generation(package, manifest, report, graphs, "lite2/generate", one_at_a_time=True)
        except LiteError as exc:
            raise PackageError(f"lite2 generation: {exc}") from exc
        if "generation" in manifest["lite2"].get("device", {}):
            _verify_runner(package, manifest, report)


def _attended(graph: str, output: str, inputs: dict, got: np.ndarray, want: np.ndarray) -> tuple:
    """A generative prefill's cache rows at its padding slots (valid 0) left out: no query ever attends them (the
    decode masks them too), and there another runtime's kernels may differ by far more than float32 rounding (Gemma 3
    270M on Lite 2.0: up to 7e-3 at padding slots, 2.6e-4 at attended ones)."""
    if not (graph.startswith("prefill") and output.startswith("cache_") and "valid" in inputs):
        return got, want
    valid = np.asarray(inputs["valid"], bool)  # (batch, bucket): the prompt's slots
    attended = np.ones(want.shape[:2], bool)
    attended[:, :valid.shape[1]] = valid
    return got[attended], want[attended]


def _scaled(tolerance: dict, want: np.ndarray) -> dict:
    """The package's tolerance with its atol scaled by the output's largest magnitude (at least 1): another
    runtime's float32 kernels sum in another order, and through a deep decoder the differences grow with the values'
    scale (Gemma 3's keys reach 90), which an elementwise rtol misses where a value is small."""
    scale = float(np.max(np.abs(want))) if want.size and np.issubdtype(want.dtype, np.floating) else 1.0
    return {**tolerance, "atol": tolerance["atol"] * max(1.0, scale)}


def _verify_runner(package: Path, manifest: dict, report: VerifyReport) -> None:
    """The stored questions generated again by the C++ runner (lite/runner) from the package's device assets, its
    own tokenizer and decode loop: the framework's tokens, exactly; or a note saying why the runner is not here."""
    from mindvl.lite import cpp_runner, lite2_runtime

    try:
        cpp_runner.build_runner()
    except lite2_runtime.Lite2Unavailable as exc:
        report.notes.append(f"C++ runner not run: {exc}")
        return
    samples = manifest["generation_samples"]
    for index, (stored, prompt) in enumerate(zip(samples["prompts"], stored_prompts(package, manifest))):
        try:
            answer = cpp_runner.run_generation(package, prompt.question, prompt.image, prompt.mel, prompt.frame_mask,
                                               samples["max_new_tokens"])
        except cpp_runner.RunnerFailed as exc:
            raise PackageError(f"C++ runner generation of sample {index}: {exc}") from exc
        got, want = np.asarray(answer["tokens"], np.int64), np.asarray(stored["tokens"], np.int64)
        report.checks.append(compare("runner/generate", f"sample {index} tokens", got, want, manifest["tolerance"]))
