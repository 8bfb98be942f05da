"""Generation on the device: time to first token and decode tokens/s of one generative package on the MindSpore
Lite 2.0 runtime (Python and the C++ runner), on its GraphCell graphs and in the framework.

    python benchmarks/lite_generate.py --package PKG [--checkpoint RUN] [--data ROOT] [--tokens 32]
                                       [--repeat 5] [--threads 1] [--json OUT]

PKG is a generative package exported with `mindvl export --target lite2`; the framework loads the checkpoint
it was exported from (its manifest's source, or --checkpoint). Every peer answers the same test image and typed
question (the data set's first test question; --data defaults to the recipe's data.root), greedy with
ignore_eos, so every answer is --tokens tokens long:
  lite2        DevicePipeline(backend="lite2").stream: the graphs in Lite 2.0 worker processes, batch 1;
  runner       mindvl_runner --generate (lite/runner, C++), its own first_token_ms and decode_tokens_per_s
               (graph building left out, as for the others after their warm-up);
  graphcell    DevicePipeline(backend="graphcell").stream: the package's MindIR graphs (what the server runs);
  framework    mindvl.from_pretrained(run).stream: the MultimodalLM cells in graph mode
               (kernels "standard", the operators the package holds).
Time to first token: from the call (the image decoded inside it) to the first token; decode tokens/s: the
tokens after the first over their time. Each figure is the median of --repeat answers after one warm-up answer
(graph compilation and building). All peers share this process and its --threads CPU threads (MindSpore's
thread count can be set once per process; Lite 2.0 and the runner take it per model).
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

os.environ.setdefault("GLOG_v", "3")


def timed_stream(stream) -> tuple:
    """(seconds to the first delta, decode tokens/s after it, tokens) of one answer's stream."""
    start = time.perf_counter()
    first = None
    tokens = []
    for delta in stream:
        tokens.append(delta.token)
        first = time.perf_counter() if first is None else first
    end = time.perf_counter()
    return first - start, (len(tokens) - 1) / (end - first), tokens


def summary(runs) -> dict:
    return {"first_token_ms": statistics.median(r[0] for r in runs) * 1000,
            "decode_tokens_per_s": statistics.median(r[1] for r in runs), "tokens": runs[-1][2]}


def measure_pipeline(package: Path, backend: str, example, tokens: int, repeat: int, threads: int) -> dict:
    from mindvl.lite.device import DevicePipeline
    from mindvl.lite.lite_model import Context

    with DevicePipeline(package, backend=backend, context=Context(threads)) as device:
        def answer():
            return timed_stream(device.stream(image=example.image, question=example.question, max_new_tokens=tokens,
                                              ignore_eos=True))
        answer()  # builds the graphs (lite2: a worker process each)
        return summary([answer() for _ in range(repeat)])


def measure_runner(package: Path, example, tokens: int, repeat: int, threads: int) -> dict:
    from mindvl.lite.cpp_runner import build_runner

    runner = build_runner()
    with tempfile.TemporaryDirectory() as scratch:
        image = Path(scratch) / "question.png"
        image.write_bytes(example.image)
        runs = []
        for _ in range(repeat + 1):
            done = subprocess.run([str(runner), str(package), "--generate", "--image", str(image), "--question",
                                   example.question, "--max-new-tokens", str(tokens), "--ignore-eos", "--threads",
                                   str(threads)], capture_output=True, text=True, check=True)
            answer = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append((answer["first_token_ms"] / 1000, answer["decode_tokens_per_s"], answer["tokens"]))
    return {**summary(runs[1:]), "build_ms": answer["build_ms"]}


def measure_framework(checkpoint: str, cache_len: int, example, tokens: int, repeat: int) -> dict:
    from mindvl import from_pretrained
    from mindvl import preprocess as P
    from mindvl.engine.prompts import MultimodalPrompt

    generator = from_pretrained(checkpoint, cache_len=cache_len, kernels="standard")

    def answer():
        def stream():
            pixels = P.decode_image(example.image, generator.pre)
            yield from generator.stream(MultimodalPrompt(example.question, pixels), max_new_tokens=tokens,
                                        ignore_eos=True)
        return timed_stream(stream())
    answer()  # compiles the prefill and decode graphs
    return summary([answer() for _ in range(repeat)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, help="a generative package exported with --target lite2")
    parser.add_argument("--checkpoint", help="the run the package came from (default: its manifest's source)")
    parser.add_argument("--data", help="data root holding the test questions (default: the recipe's data.root)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    add_plot_option(parser)
    args = parser.parse_args()

    import mindspore as ms

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind
    from mindvl.data.reading.examples import query_examples
    from mindvl.package_reader import read_manifest

    package = Path(args.package)
    manifest = read_manifest(package)
    if not manifest.get("lite2") or "generation" not in manifest:
        raise SystemExit(f"{package}: not a generative package with lite2/ graphs; export a generative run with "
                         f"`mindvl export --target lite2`")
    checkpoint = args.checkpoint or manifest["source"]["checkpoint"]
    data = args.data or json.loads((package / "config.json").read_text())["data"]["root"]
    example = query_examples(data, 1)[0]
    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    machine = f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores"
    print(f"machine: {machine}; {args.threads} thread(s)", flush=True)
    print(f"package {package.name}: {manifest['parameters']:,} parameters, cache {manifest['generation']['cache_len']}; "
          f"question {example.question!r} with its image, {args.tokens} tokens greedy (ignore_eos)", flush=True)
    results = {
        "lite2": measure_pipeline(package, "lite2", example, args.tokens, args.repeat, args.threads),
        "runner": measure_runner(package, example, args.tokens, args.repeat, args.threads),
        "graphcell": measure_pipeline(package, "graphcell", example, args.tokens, args.repeat, args.threads),
        "framework": measure_framework(checkpoint, manifest["generation"]["cache_len"], example, args.tokens,
                                       args.repeat),
    }
    print("| peer | time to first token | decode tokens/s | tokens as the framework's |")
    print("|---|---|---|---|")
    for peer, row in results.items():
        same = row["tokens"] == results["framework"]["tokens"]
        print(f"| {peer} | {row['first_token_ms']:.2f} ms | {row['decode_tokens_per_s']:.0f} | {'yes' if same else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "tokens": args.tokens, "results": results},
                                              indent=2))
    plot_comparison(args.plot, [{"peer": peer, **row} for peer, row in results.items()], x="peer", series="peer",
                    value={"first_token_ms": "time to first token (ms)", "decode_tokens_per_s": "decode tokens/s"},
                    machine=machine, title=f"generation on the device, {manifest['name']}: {args.tokens} tokens, "
                                           f"{args.threads} thread(s), median of {args.repeat}")
    sys.exit(0 if all(r["tokens"] == results["framework"]["tokens"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
