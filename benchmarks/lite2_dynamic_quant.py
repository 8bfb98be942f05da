"""The MindSpore Lite 2.0 runtime's own quantized execution (its converter's dynamic quantization: int8 weights,
activations quantized per call) measured beside its float32 execution of the same graphs, in one run.

    python benchmarks/lite2_dynamic_quant.py [--layers 6] [--width 640] [--hidden 2048] [--vocab 32768]
                                             [--package PKG] [--repeats 30] [--json OUT]

Graphs: a decoder-shaped stack (`--layers` residual MLPs width -> hidden -> width, then a head to `--vocab`,
Gemma 3 270M's widths by default) exported and down-converted as `mindvl export --target lite2` does; with
`--package`, a generative package's lite2/ graphs too (random but valid decode inputs). Each goes through the
wheel's converter library (benchmarks/lite2_converter.cc) as it is, with dynamic quantization (`[common_quant_param]
quant_type=DYNAMIC_QUANT bit_num=8`: int8 products) and with weight quantization (WEIGHT_QUANT, 8 and 4 bits: the
weights stored small, widened to float32 when the model is built), and runs on the Lite 2.0 runtime (the bridge and worker
of mindvl.lite) at 1 and 2 threads: file size, median latency, the largest error relative to the float32
output's largest value, and whether each row's argmax agrees.
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from mindvl.lite.lite_model import Lite2Backend, LiteError

HERE = Path(__file__).resolve().parent
FORMS = {  # the converter's INI config of each form ("": the graph converted as it is)
    "float32": "",
    "dynamic int8": "[common_quant_param]\nquant_type=DYNAMIC_QUANT\nbit_num=8\n",
    "weight int8": "[common_quant_param]\nquant_type=WEIGHT_QUANT\nbit_num=8\nmin_quant_weight_size=0\n",
    "weight int4": "[common_quant_param]\nquant_type=WEIGHT_QUANT\nbit_num=4\nmin_quant_weight_size=0\n",
}


def converter(folder: Path):
    """convert(model, output, config) through benchmarks/lite2_converter.cc, compiled into `folder` against the
    unpacked Lite 2.0 wheel."""
    from mindvl.lite import lite2_runtime

    runtime = lite2_runtime.ensure_runtime()
    command = folder / "lite2_converter"
    subprocess.run([os.environ.get("CXX", "g++"), *[f for f in lite2_runtime.BRIDGE_FLAGS if f not in ("-shared", "-fPIC")],
                    f"-I{runtime}", f"-I{runtime / 'include'}", str(HERE / "lite2_converter.cc"), "-o", str(command),
                    f"-L{runtime / 'lib'}", "-lmindspore_converter", "-lmindspore-extendrt_python",
                    f"-Wl,--disable-new-dtags,-rpath,{runtime / 'lib'}"], check=True)

    def convert(model: Path, output: Path, config: str) -> Path:
        arguments = [str(command), str(model), str(output)]
        if config:
            output.with_suffix(".cfg").write_text(config)
            arguments.append(str(output.with_suffix(".cfg")))
        done = subprocess.run(arguments, capture_output=True, text=True, env={**os.environ, "GLOG_v": "3"})
        if done.returncode:
            raise RuntimeError(f"{model}: the converter failed: {done.stderr.strip()[-500:]}")
        return output.with_suffix(".mindir")
    return convert


def mlp_graph(folder: Path, layers: int, width: int, hidden: int, vocab: int) -> Path:
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindvl.export.lite2_mindir import convert_mindir

    ms.set_context(mode=ms.GRAPH_MODE)

    class Stack(nn.Cell):
        def __init__(self):
            super().__init__()
            self.blocks = nn.CellList([nn.SequentialCell(nn.Dense(width, hidden), nn.GELU(), nn.Dense(hidden, width))
                                       for _ in range(layers)])
            self.head = nn.Dense(width, vocab, has_bias=False)

        def construct(self, x):
            for block in self.blocks:
                x = x + block(x)
            return self.head(x)

    stack = Stack()
    stack.set_train(False)
    ms.export(stack, Tensor(np.zeros((1, width), np.float32)), file_name=str(folder / "stack"), file_format="MINDIR")
    data, _ = convert_mindir((folder / "stack.mindir").read_bytes(), "stack")
    path = folder / "stack_lite2.mindir"
    path.write_bytes(data)
    return path


def sample_inputs(infos, rng):
    """Valid inputs of a graph: a decode step's (a few valid slots, its slot after them) or random floats."""
    arrays = []
    for name, dtype, dims in infos:
        shape = [1 if d < 0 else d for d in dims]
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype) * 0.5)
        elif name == "slot_valid" or shape[-1] > 16:
            valid = np.zeros(shape, dtype)
            valid[..., :8] = 1
            arrays.append(valid)
        else:
            arrays.append(np.full(shape, 8 if name == "slot" else 5, dtype))
    return arrays


def measure(path: Path, inputs, threads: int, repeats: int):
    backend = Lite2Backend()
    backend.build(str(path), threads)
    try:
        arrays = inputs(backend.inputs())
        output = backend.predict(arrays)[0]
        times = []
        for _ in range(repeats):
            backend.predict(arrays)
            times.append(backend.last_predict_seconds)
    finally:
        backend.close()
    return output, float(np.median(times) * 1000)


def main(argv=None) -> None:
    from mindvl.cells.kernels.machine import machine_line

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--package", default=None, help="also a generative package's lite2/ graphs")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOG_v", "3")
    print(f"machine: {machine_line()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        convert = converter(work)
        graphs = {f"stack {args.layers}x{args.width}-{args.hidden}, head {args.vocab}":
                  mlp_graph(work, args.layers, args.width, args.hidden, args.vocab)}
        if args.package:
            lite2 = Path(args.package) / "lite2"
            graphs.update({f"{Path(args.package).name} {p.stem}": p for p in sorted(lite2.glob("decode*.mindir"))})
        for name, source in graphs.items():
            seed = np.random.default_rng(0)
            fixed = {}

            def inputs(infos):  # the same inputs for both forms of a graph
                if "arrays" not in fixed:
                    fixed["arrays"] = sample_inputs(infos, seed)
                return fixed["arrays"]

            forms = {form: convert(source, work / f"{len(rows)}_{index}", config)
                     for index, (form, config) in enumerate(FORMS.items())}
            for threads in (1, 2):
                outputs = {}
                for form, path in forms.items():
                    row = {"graph": name, "form": form, "threads": threads, "mb": path.stat().st_size / 2 ** 20}
                    try:
                        outputs[form], row["ms"] = measure(path, inputs, threads, args.repeats)
                    except LiteError as error:  # a form the runtime cannot build: its row says so
                        row["error"] = str(error).rsplit(": ", 1)[-1]
                    else:
                        reference = outputs["float32"].reshape(outputs["float32"].shape[0], -1)
                        mine = outputs[form].reshape(reference.shape)
                        row.update(rel_error=float(np.abs(mine - reference).max() / np.abs(reference).max()),
                                   argmax_agrees=float((mine.argmax(-1) == reference.argmax(-1)).mean()))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print("\n| graph | form | threads | file MB | median ms | max rel. error | argmax agrees |\n|---|---|---|---|---|---|---|")
    for r in rows:
        figures = (f"{r['ms']:.2f} | {r['rel_error']:.1e} | {r['argmax_agrees']:.0%}" if "ms" in r
                   else f"not built ({r['error']}) | - | -")
        print(f"| {r['graph']} | {r['form']} | {r['threads']} | {r['mb']:.1f} | {figures} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
