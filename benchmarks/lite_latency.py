"""Device latency of a package's graphs: MindSpore Lite 2.0 vs GraphCell vs ONNX Runtime, 1 and 2 threads.

    python benchmarks/lite_latency.py --checkpoint RUN [--repeat 50] [--threads 1 2]

From one checkpoint it writes a package with lite2/ graphs (static batch 1) and the ONNX export of the
same graphs at batch 1, then, for each thread count, in a fresh process (MindSpore's CPU thread count
can be set once per process), times one sample through every graph on:
  Lite 2.0     LiteModel(backend="lite2"): the registry wheel's runtime in its worker process; two
               figures: the call as Python sees it (pipe included) and the runtime's own Predict time;
  GraphCell    mindspore.load + nn.GraphCell, mindspore.device_context.cpu.op_tuning.threads_num(N);
  ONNX Runtime InferenceSession, intra_op_num_threads=N (the peer a device developer would pick).
Each figure is the median of --repeat calls after --warmup calls, in milliseconds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

GRAPHS = ("vqa", "image_embed", "text_embed", "audio_embed")
PEERS = {"lite2_ms": "Lite 2.0 (call)", "lite2_runtime_ms": "Lite 2.0 (runtime)", "graphcell_ms": "GraphCell",
         "onnxruntime_ms": "ONNX Runtime"}


def machine() -> str:
    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind

    return f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores"


def median_ms(call, repeat: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(package: Path, onnx_dir: Path, threads: int, repeat: int, warmup: int) -> dict:
    """One thread count, in this process (run by `main` in a child process per thread count)."""
    import mindspore as ms
    import numpy as np
    import onnxruntime as ort

    from mindvl.lite.lite_model import Context, LiteModel
    from mindvl.package_reader import load_samples, read_manifest

    ms.device_context.cpu.op_tuning.threads_num(threads)
    manifest = read_manifest(package)
    rows = {}
    for graph in GRAPHS:
        inputs, _ = load_samples(package, manifest, f"{graph}_b1")
        arrays = list(inputs.values())
        row = {}
        with LiteModel.from_package(package, graph, Context(threads), backend="lite2") as lite:
            runtime_seconds = []

            def lite_call():
                lite.run(arrays)
                runtime_seconds.append(lite.last_predict_seconds)

            row["lite2_ms"] = median_ms(lite_call, repeat, warmup)
            row["lite2_runtime_ms"] = statistics.median(runtime_seconds[warmup:]) * 1000
        with LiteModel.from_package(package, graph, Context(threads), backend="graphcell") as cell:
            row["graphcell_ms"] = median_ms(lambda: cell.run(arrays), repeat, warmup)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(onnx_dir / f"{graph}.onnx"), options, providers=["CPUExecutionProvider"])
        feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
        ort_outputs = session.run(None, feeds)
        row["onnxruntime_ms"] = median_ms(lambda: session.run(None, feeds), repeat, warmup)
        lite_outputs = LiteModel.from_package(package, graph, Context(threads), backend="lite2").run(arrays)
        row["max_abs_diff_lite2_vs_onnx"] = float(max(
            np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()
            for a, b in zip(lite_outputs.values(), ort_outputs)))
        rows[graph] = row
    return rows


def prepare(checkpoint: str, folder: Path) -> tuple:
    from mindvl.export.onnx import export_onnx
    from mindvl.export.package_writer import write_package
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(checkpoint)
    package = write_package(cfg, model, folder / "package", record, progress=False, lite2_batch=1)
    report = export_onnx(cfg, model, folder / "onnx", batch=1)
    failed = [g for g, r in report["graphs"].items() if not r["ok"]]
    if failed:
        raise SystemExit(f"ONNX export failed for {failed}: {report['summary']}")
    return package, folder / "onnx"


def table(results: dict) -> str:
    lines = ["| graph | threads | Lite 2.0 (call) | Lite 2.0 (runtime) | GraphCell | ONNX Runtime | Lite call / ORT |",
             "|---|---|---|---|---|---|---|"]
    for threads, rows in sorted(results.items()):
        for graph, row in rows.items():
            lines.append(f"| {graph} | {threads} | {row['lite2_ms']:.2f} ms | {row['lite2_runtime_ms']:.2f} ms | "
                         f"{row['graphcell_ms']:.2f} ms | {row['onnxruntime_ms']:.2f} ms | "
                         f"{row['lite2_ms'] / row['onnxruntime_ms']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="run folder, step_* folder or model.safetensors")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    add_plot_option(parser)
    parser.add_argument("--measure", nargs=3, metavar=("PACKAGE", "ONNX_DIR", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # the child: one thread count
        package, onnx_dir, threads = args.measure
        print(json.dumps(measure(Path(package), Path(onnx_dir), int(threads), args.repeat, args.warmup)))
        return
    if not args.checkpoint:
        parser.error("--checkpoint is required")
    with tempfile.TemporaryDirectory() as scratch:
        package, onnx_dir = prepare(args.checkpoint, Path(scratch))
        results = {}
        for threads in args.threads:
            child = subprocess.run([sys.executable, __file__, "--measure", str(package), str(onnx_dir), str(threads),
                                    "--repeat", str(args.repeat), "--warmup", str(args.warmup)],
                                   capture_output=True, text=True, env={**os.environ, "GLOG_v": "3"})
            if child.returncode != 0:
                raise SystemExit(f"measuring {threads} thread(s) failed:\n{child.stderr[-3000:]}")
            results[threads] = json.loads(child.stdout.strip().splitlines()[-1])
    print(table(results))
    worst = max(abs(row["max_abs_diff_lite2_vs_onnx"]) for rows in results.values() for row in rows.values())
    print(f"\nlargest |Lite 2.0 - ONNX Runtime| over all outputs: {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    plot_comparison(args.plot, [{"graph": graph, "threads": f"{threads} thread(s)", "peer": peer, "ms": row[key]}
                                for threads, rows in results.items() for graph, row in rows.items()
                                for key, peer in PEERS.items()],
                    x="graph", series="peer", value="ms", panel="threads", log=True,
                    ylabel=f"ms a call, median of {args.repeat}",
                    title="one sample through each graph of the package (batch 1)", machine=machine())


if __name__ == "__main__":
    main()
