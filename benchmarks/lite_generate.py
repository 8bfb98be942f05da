"""Generation on the device: time to first token, decode tokens/s and peak RSS of one generative package on the
MindSpore Lite 2.0 runtime (Python and the C++ runner), on its GraphCell graphs and in the framework, beside
llama.cpp running the decoder's GGUF, at each thread count.

    python benchmarks/lite_generate.py --package PKG [--checkpoint RUN] [--data ROOT] [--tokens 32] [--repeat 3]
                                       [--threads 1,2] [--peers lite2,runner,...] [--gguf FILE] [--json OUT]
                                       [--plot STEM]

PKG is a generative package exported with `mindvl export --target lite2`; the framework loads the checkpoint
it was exported from (its manifest's source, or --checkpoint). Every peer answers the data set's first test
question (--data defaults to the recipe's data.root), greedy with ignore_eos, so every answer is --tokens tokens:
  lite2            DevicePipeline(backend="lite2").stream: the graphs in Lite 2.0 worker processes, batch 1;
  runner           mindvl_runner --generate (lite/runner, C++): one graph in memory at a time, its own
                   first_token_ms and decode_tokens_per_s (graph building left out, as for the others after their
                   warm-up answer);
  graphcell        DevicePipeline(backend="graphcell").stream: the package's MindIR graphs (what the server runs);
  framework        mindvl.from_pretrained(run).stream: the MultimodalLM cells in graph mode (kernels "standard",
                   the operators the package holds);
  llama.cpp        llama-cpp-python (built from source) on --gguf (default: the registry's Gemma 3 270M Q4_K_M, the
                   file vlm-s's decoder was converted from), the same question's chat prompt without the image (it
                   reads text only), its Q4_K_M weights;
  llama.cpp-q8_0   the same at Q8_0 (the GGUF requantized by llama.cpp, made once beside it).
Each (peer, thread count) runs in a child process of its own; its peak RSS is the largest sum of VmRSS over the
child and its descendants (the Lite 2.0 workers, the runner), sampled every 10 ms. Time to first token: from the
call (the image decoded inside it) to the first token; decode tokens/s: the tokens after the first over their time;
each the median of --repeat answers after a warm-up answer (graph compilation and building).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

os.environ.setdefault("GLOG_v", "3")
PEERS = ("lite2", "runner", "graphcell", "framework", "llama.cpp", "llama.cpp-q8_0")


class TreePeak:
    """The largest sum of VmRSS over this process and its descendants, sampled every `every` s while running."""

    def __init__(self, every: float = 0.01) -> None:
        self.every, self.peak_kb, self._done = every, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _tree(pid: int) -> list:
        try:
            children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                        for c in (task / "children").read_text().split()]
        except OSError:
            return [pid]
        return [pid, *(p for child in children for p in TreePeak._tree(child))]

    @staticmethod
    def _rss_kb(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while not self._done.wait(self.every):
            self.peak_kb = max(self.peak_kb, sum(self._rss_kb(pid) for pid in self._tree(os.getpid())))

    def stop(self) -> float:
        """-> the peak in GiB."""
        self._done.set()
        self._thread.join()
        return self.peak_kb / 2 ** 20


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


# ----------------------------------------------------------------------------- peers (each in a child process)

def measure_pipeline(args, backend: str, example) -> dict:
    from mindvl.lite.device import DevicePipeline
    from mindvl.lite.lite_model import Context

    with DevicePipeline(args.package, backend=backend, context=Context(args.threads)) as device:
        def answer():
            return timed_stream(device.stream(image=example.image, question=example.question,
                                              max_new_tokens=args.tokens, ignore_eos=True))
        answer()  # builds the graphs (lite2: a worker process each)
        return summary([answer() for _ in range(args.repeat)])


def measure_runner(args, example) -> dict:
    from mindvl.lite.cpp_runner import build_runner

    runner = build_runner()
    with tempfile.TemporaryDirectory() as scratch:
        image = Path(scratch) / "question.png"
        image.write_bytes(example.image)
        runs = []
        for _ in range(args.repeat + 1):
            done = subprocess.run([str(runner), str(args.package), "--generate", "--image", str(image), "--question",
                                   example.question, "--max-new-tokens", str(args.tokens), "--ignore-eos",
                                   "--threads", str(args.threads)], capture_output=True, text=True, check=True)
            answer = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append((answer["first_token_ms"] / 1000, answer["decode_tokens_per_s"], answer["tokens"]))
    return {**summary(runs[1:]), "build_ms": answer["build_ms"]}


def measure_framework(args, example, cache_len: int) -> dict:
    from mindvl import from_pretrained
    from mindvl import preprocess as P
    from mindvl.engine.prompts import MultimodalPrompt

    generator = from_pretrained(args.checkpoint, cache_len=cache_len, kernels="standard")

    def answer():
        def stream():
            pixels = P.decode_image(example.image, generator.pre)
            yield from generator.stream(MultimodalPrompt(example.question, pixels), max_new_tokens=args.tokens,
                                        ignore_eos=True)
        return timed_stream(stream())
    answer()  # compiles the prefill and decode graphs
    return summary([answer() for _ in range(args.repeat)])


def measure_llama_cpp(args, example) -> dict:
    """The question's chat prompt without its image, through llama.cpp's own decode loop on the GGUF."""
    from llama_cpp import Llama

    sys.path.insert(0, str(Path(__file__).parent))
    from generate import q8_0_gguf  # the Q8_0 file generate.py's llama.cpp peer reads

    from mindvl.engine.package_graphs import package_layout
    from mindvl.engine.prompts import MultimodalPrompt
    from mindvl.package_reader import read_manifest

    ids = package_layout(args.package, read_manifest(args.package)).render(MultimodalPrompt(example.question)).ids
    ids = [int(i) for i in ids]
    gguf = q8_0_gguf(args.gguf) if args.peer == "llama.cpp-q8_0" else args.gguf
    model = Llama(model_path=gguf, n_threads=args.threads, n_threads_batch=args.threads,
                  n_ctx=len(ids) + args.tokens + 8, n_batch=len(ids), logits_all=True, verbose=False)

    def answer():
        start = time.perf_counter()
        model.reset()
        model.eval(ids)
        tokens = [int(model.scores[model.n_tokens - 1].argmax())]
        first = time.perf_counter()
        while len(tokens) < args.tokens:
            model.eval([tokens[-1]])
            tokens.append(int(model.scores[model.n_tokens - 1].argmax()))
        return first - start, (len(tokens) - 1) / (time.perf_counter() - first), tokens
    answer()
    return {**summary([answer() for _ in range(args.repeat)]), "prompt_tokens": len(ids)}


def run_peer(args) -> None:
    import mindspore as ms

    from mindvl.data.reading.examples import query_examples
    from mindvl.package_reader import read_manifest

    peak = TreePeak()
    example = query_examples(args.data, 1)[0]
    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    if args.peer in ("lite2", "graphcell"):
        row = measure_pipeline(args, args.peer, example)
    elif args.peer == "runner":
        row = measure_runner(args, example)
    elif args.peer == "framework":
        row = measure_framework(args, example, read_manifest(args.package)["generation"]["cache_len"])
    else:
        row = measure_llama_cpp(args, example)
    print("RESULT " + json.dumps({**row, "peak_rss_gb": peak.stop()}), flush=True)


# ----------------------------------------------------------------------------- the parent

def run_child(args, peer: str, threads: int) -> dict:
    command = [sys.executable, __file__, "--package", str(args.package), "--checkpoint", args.checkpoint, "--data",
               args.data, "--tokens", str(args.tokens), "--repeat", str(args.repeat), "--gguf", args.gguf,
               "--peer", peer, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, type=Path, help="a generative package exported with --target lite2")
    parser.add_argument("--checkpoint", help="the run the package came from (default: its manifest's source)")
    parser.add_argument("--data", help="data root holding the test questions (default: the recipe's data.root)")
    parser.add_argument("--gguf", help="the decoder's GGUF for the llama.cpp peers (default: the registry's Gemma 3 "
                                       "270M)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # a child process: this peer only
    parser.add_argument("--json", help="also write the figures to this file")
    add_plot_option(parser)
    args = parser.parse_args()

    from mindvl.package_reader import read_manifest

    manifest = read_manifest(args.package)
    if not manifest.get("lite2") or "generation" not in manifest:
        raise SystemExit(f"{args.package}: not a generative package with lite2/ graphs; export a generative run with "
                         f"`mindvl export --target lite2`")
    args.checkpoint = args.checkpoint or manifest["source"]["checkpoint"]
    args.data = args.data or json.loads((args.package / "config.json").read_text())["data"]["root"]
    if args.gguf is None:
        from mindvl.pretrained.llm import installed_gguf

        args.gguf = str(installed_gguf())
    if args.peer:
        args.threads = int(args.threads)
        run_peer(args)
        return

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind

    machine = f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores"
    print(f"machine: {machine}", flush=True)
    print(f"package {args.package.name}: {manifest['parameters']:,} parameters, cache "
          f"{manifest['generation']['cache_len']}; the data set's first test question with its image, {args.tokens} "
          f"tokens greedy (ignore_eos), median of {args.repeat}; llama.cpp: {Path(args.gguf).name}", flush=True)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for peer in args.peers.split(","):
            row = {"peer": peer, "threads": threads, **run_child(args, peer, threads)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "tokens"}), flush=True)
    # the framework's tokens; without its checkpoint (a package exported from a model never trained) GraphCell's, the
    # MindSpore runtime on the package's graphs
    base = "framework" if any(r["peer"] == "framework" and "tokens" in r for r in rows) else "graphcell"
    reference = {r["threads"]: r.get("tokens") for r in rows if r["peer"] == base}
    print(f"| peer | threads | time to first token | decode tokens/s | peak RSS GiB | tokens as {base}'s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['peer']} | {row['threads']} | failed: {row['error']} | | | |")
            continue
        same = ("n/a (text only)" if row["peer"].startswith("llama.cpp") else
                "yes" if row["tokens"] == reference.get(row["threads"]) else "NO")
        print(f"| {row['peer']} | {row['threads']} | {row['first_token_ms']:.0f} ms | "
              f"{row['decode_tokens_per_s']:.1f} | {row['peak_rss_gb']:.2f} | {same} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "tokens": args.tokens, "rows": rows}, indent=2))
    done = [r for r in rows if "error" not in r]
    plot_comparison(args.plot, [{**r, "peer": f"{r['peer']} x{r['threads']}"} for r in done], x="peer", series="peer",
                    value={"first_token_ms": "time to first token (ms)", "decode_tokens_per_s": "decode tokens/s",
                           "peak_rss_gb": "peak RSS (GiB)"},
                    machine=machine, title=f"generation on the device, {manifest['name']}: {args.tokens} tokens, "
                                           f"median of {args.repeat}")
    device = [r for r in done if not r["peer"].startswith("llama.cpp")]
    sys.exit(0 if all(r["tokens"] == reference.get(r["threads"]) for r in device) else 1)


if __name__ == "__main__":
    main()
