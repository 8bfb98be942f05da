"""ONNX export of the package's graphs, for comparisons with ONNX runtimes (the Lite work's peer).

MindSpore exports ONNX from concrete inputs (static shapes: the stored sample batch) and converts a
subset of its operators. Two the model uses have no converter in MindSpore 2.10, Erf (exact GELU) and
Rsqrt (embedding normalisation); for the export they are replaced by standard-op formulations
(cells/portable.py: erf within 1.5e-7, Pow(x, -0.5)) and put back afterwards, and the report lists the
substitution. A graph that still fails is reported with the operator MindSpore names instead of
stopping the others. Exported files are checked with `onnx.checker` and their operator set is listed.
"""
import json
import re
from pathlib import Path
from typing import Dict, List, Sequence

import mindspore as ms

from mindvl.cells.activation import GELU
from mindvl.cells.heads import ContrastiveHead
from mindvl.cells.portable import PolynomialErf, PowRsqrt, substituted
from mindvl.config import Config
from mindvl.data import load_meta, load_tokenizer
from mindvl.export.graphs import DTYPES, graph_specs
from mindvl.export.package_writer import SAMPLE_MODALITIES, sample_graph_inputs, sample_inputs

REPORT = "onnx_report.json"
# how MindSpore 2.10 words an operator its ONNX exporter lacks:
# "Can not find key Erf in convert map. Exporting Erf operator is not yet supported."
UNSUPPORTED_OP = (re.compile(r"Exporting (\w+) operator"), re.compile(r"find key (\w+) in convert map"))


def failing_op(message: str) -> str:
    """The operator a MindSpore ONNX export error names ("unknown" when it names none)."""
    for pattern in UNSUPPORTED_OP:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return "unknown"


SUBSTITUTIONS = {"Erf": "PolynomialErf (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7)", "Rsqrt": "Pow(x, -0.5)"}


def portable_ops(model):
    """Within the block, every GELU's Erf and every ContrastiveHead's Rsqrt in `model` is its portable
    formulation; the primitives are restored on exit."""
    return substituted(model, [(GELU, "erf", lambda cell: PolynomialErf()),
                               (ContrastiveHead, "rsqrt", lambda cell: PowRsqrt())])


def export_onnx(cfg: Config, model, out: Path, graphs: Sequence[str] = (), batch: int = len(SAMPLE_MODALITIES)
                ) -> Dict[str, object]:
    """Write <out>/<graph>.onnx for every graph (or only `graphs`) MindSpore can export, with the static
    batch `batch`, and <out>/onnx_report.json naming, for each graph that fails, the operator it failed at."""
    import onnx

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = load_meta(cfg.data.root)["answers"]
    specs = graph_specs(cfg.preprocess, cfg.model.embed_dim, len(labels), load_tokenizer(cfg.data.root))
    columns = sample_inputs(cfg, batch)
    model.set_train(False)
    results: Dict[str, dict] = {}
    for name, spec in specs.items():
        if graphs and name not in graphs:
            continue
        net = spec.build(model)
        net.set_train(False)
        inputs = sample_graph_inputs(spec, columns)
        path = out / f"{name}.onnx"
        try:
            with portable_ops(model):
                ms.export(net, *(ms.Tensor(v, DTYPES[t.dtype][0]) for t, v in zip(spec.inputs, inputs.values())),
                          file_name=str(path.with_suffix("")), file_format="ONNX")
            proto = onnx.load(str(path))
            onnx.checker.check_model(proto)
        except Exception as exc:  # MindSpore raises RuntimeError/TypeError/ValueError; onnx its own types
            message = str(exc).strip()
            lines = [line for line in message.splitlines() if line.strip()]
            results[name] = {"ok": False, "op": failing_op(message), "error": lines[0][:400] if lines else ""}
            continue
        ops: List[str] = sorted({node.op_type for node in proto.graph.node})
        results[name] = {"ok": True, "file": path.name, "bytes": path.stat().st_size, "batch": len(inputs[spec.inputs[0].name]),
                        "inputs": [i.name for i in proto.graph.input], "outputs": [t.name for t in spec.outputs],
                           "onnx_ops": ops}
    lines = [f"{name:<12} " + (f"ok: {g['file']} ({len(g['onnx_ops'])} ONNX op types, static batch {g['batch']})"
                               if g["ok"] else f"FAILED at op {g['op']}: {g['error']}") for name, g in results.items()]
    report = {"ok": all(g["ok"] for g in results.values()), "graphs": results, "substituted": SUBSTITUTIONS,
              "summary": "\n".join(lines)}
    (out / REPORT).write_text(json.dumps(report, indent=2))
    return report
