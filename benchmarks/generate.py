"""Text generation speed on this CPU: mindvl against transformers and llama.cpp, same weights, same threads.

    python benchmarks/generate.py [--model DIR] [--prompt-tokens 128] [--new-tokens 64] [--threads 2]
                                  [--peers mindvl,mindvl-int8,...] [--json FILE] [--plot PNG]

Gemma 3 270M from the registry's GGUF (weights.txt), greedy, one prompt of --prompt-tokens tokens, each
peer in a process of its own (its own peak memory, its own threads), one after the other:
  mindvl        mindvl.generation.LanguageModel in graph mode, float32 (the folder `mindvl convert llm`
                writes; converted here when --model is not given);
  mindvl-int8, mindvl-int4, mindvl-gguf
                the same with the folder converted `--weights int8` (per channel), `int4` (groups of 32) and
                `gguf` (the GGUF's own Q8_0 / Q5_0 / Q6_K / Q4_K blocks), next to --model;
  mindir        the float32 prefill and decode graphs exported to MindIR and loaded back (mindspore.load +
                nn.GraphCell), the graphs a deployment runs;
  transformers  Gemma3ForCausalLM (PyTorch eager, float32) from the same GGUF (reading a GGUF needs torch and
                accelerate besides transformers);
  llama.cpp     llama-cpp-python on the original Q4_K_M GGUF, the CPU inference reference on 4-5 bit weights;
  llama.cpp-q8_0  the same GGUF requantized to Q8_0 by llama.cpp itself (cached next to it).
                llama-cpp-python builds llama.cpp from source; on this project's Xeon a -march=native build
                (GGML_NATIVE, with AMX) crashed in its first decode (SIGSEGV), so build it without AMX:
                CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
                -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python==0.3.36
                (for an AVX2 row on an AVX-512 machine, a second build in its own venv with -DGGML_AVX512=OFF
                -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF besides
                the AMX options (pip also needs diskcache there), and the other peers under
                MINDVL_KERNEL_ARCH=x86-64-v3 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2)
Figures: prefill tokens/s (prompt tokens / time to the first new token), decode tokens/s (new tokens after the
first / their time), the first call's time (graph compilation for mindvl), peak resident memory (VmHWM).
The decode floor: a decode step reads every weight once (the tied LM head reads the whole embedding), so
tokens/s cannot beat memory bandwidth / weight bytes; bandwidth is measured here (numpy and torch reading
a 1 GiB array). Goal for mindvl: decode >= 2x transformers eager in float32, within 1.5x of the floor.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

PEERS = ("mindvl", "mindvl-int8", "mindvl-int4", "mindvl-gguf", "mindir", "transformers", "llama.cpp", "llama.cpp-q8_0")
LAYOUTS = {"mindvl": "float32", "mindir": "float32", "mindvl-int8": "int8", "mindvl-int4": "int4",
           "mindvl-gguf": "gguf"}
TEXT = ("MindSpore compiles the whole network into one graph before it runs, so the framework can fuse "
        "operators, plan memory and schedule kernels ahead of time. ")


def peak_rss_gb() -> float:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 2 ** 20


def prompt_ids(tokenizer_file: Path, count: int) -> list:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_file)).encode(TEXT * 64).ids
    return ids[:count]


# ----------------------------------------------------------------------------- peers (each in a child process)

def timed_generation(prompt_tokens: int, new_tokens: int, prefill, step) -> dict:
    """Greedy generation twice (the first call compiles or warms up, the second is timed): `prefill()` runs
    the prompt and returns the first new token, `step(token, index)` the next one."""
    timings = {}
    for attempt in ("first", "timed"):
        start = time.perf_counter()
        generated = [prefill()]
        first_token = time.perf_counter()
        for index in range(new_tokens - 1):
            generated.append(step(generated[-1], index))
        timings[attempt] = (first_token - start, time.perf_counter() - first_token, generated)
    prefill_s, decode_s, generated = timings["timed"]
    return {"prefill_tok_s": prompt_tokens / prefill_s, "decode_tok_s": (new_tokens - 1) / decode_s,
            "first_call_s": sum(timings["first"][:2]), "tokens": generated, "peak_rss_gb": peak_rss_gb()}


def split_outputs(outputs, layers: int) -> tuple:
    """(logits, keys, values) from a graph's outputs, nested (a Cell) or flat (a loaded MindIR)."""
    if len(outputs) == 3:
        return outputs
    return outputs[0], tuple(outputs[1:1 + layers]), tuple(outputs[1 + layers:])


def layout_folder(model: str, layout: str) -> str:
    """The folder of --model's weights in `layout`: --model itself for float32, else a sibling."""
    return model if layout == "float32" else f"{model.rstrip('/')}-{layout}"


def run_mindvl(args, ids: list, mindir: bool) -> dict:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from mindvl import from_pretrained
    from mindvl.cells.kernels import standard_kernels
    from mindvl.package_reader import as_array

    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    start = time.perf_counter()
    model = from_pretrained(layout_folder(args.model, LAYOUTS[args.peer]), cache_len=len(ids) + args.new_tokens + 64)
    load_s = time.perf_counter() - start
    bucket = model.layout.limits.bucket(len(ids), args.new_tokens)
    prefill, decode, layers = model.prefill_graph, model.decode_graph, model.cfg.layers
    tokens = np.full((1, bucket), model.pad_id, np.int32)
    tokens[0, bucket - len(ids):] = ids
    valid = tokens * 0 == 0
    valid[0, :bucket - len(ids)] = False
    slot_valid = np.zeros((1, model.cache_len), bool)
    slot_valid[:, :bucket] = valid
    inputs = [Tensor(tokens), Tensor(valid)]
    step_inputs = lambda t, p, s, caches: [Tensor(np.array([[t]], np.int32)), Tensor(np.array([[p]], np.int32)),  # noqa: E731
                                           Tensor(np.full((1, 1), s, np.int32)), Tensor(slot_valid), *caches[0], *caches[1]]
    export_s = 0.0
    if mindir:  # the graphs exported and loaded back
        folder = Path(tempfile.mkdtemp(prefix="mindvl_mindir_"))
        start = time.perf_counter()
        _, cache_k, cache_v = split_outputs(prefill(*inputs), layers)
        with standard_kernels(model.lm):  # a MindIR holds standard operators only
            ms.export(prefill, *inputs, file_name=str(folder / "prefill"), file_format="MINDIR")
            ms.export(decode, *step_inputs(0, 0, bucket, (cache_k, cache_v)), file_name=str(folder / "decode"),
                      file_format="MINDIR")
        prefill = nn.GraphCell(ms.load(str(folder / "prefill.mindir")))
        decode = nn.GraphCell(ms.load(str(folder / "decode.mindir")))
        export_s = time.perf_counter() - start
    state = {}

    def run_prefill():
        logits, state["k"], state["v"] = split_outputs(prefill(*inputs), layers)
        slot_valid[:, bucket:] = False
        return int(logits.asnumpy().argmax())

    def written(caches, outputs, slot):
        """The caches after a step: its outputs, or, from a step that returns only its new rows (cells.decoder
        Decode's `beside`, as the fused decode steps do), the caches with those rows written at `slot` in place."""
        if outputs[0].shape[1] == model.cache_len:
            return outputs
        for cache, row in zip(caches, outputs):
            as_array(cache)[:, slot] = as_array(row)[:, 0]
        return caches

    def run_step(token, index):
        slot = bucket + index
        slot_valid[:, slot] = True
        logits, keys, values = split_outputs(
            decode(*step_inputs(token, len(ids) + index, slot, (state["k"], state["v"]))), layers)
        state["k"], state["v"] = written(state["k"], keys, slot), written(state["v"], values, slot)
        return int(logits.asnumpy().argmax())

    return {**timed_generation(len(ids), args.new_tokens, run_prefill, run_step), "load_s": load_s,
            "export_s": export_s}


def run_transformers(args, ids: list) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    gguf = Path(args.gguf)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    prompt = torch.tensor([ids])
    state = {}

    def run_prefill():
        out = model(prompt, use_cache=True)
        state["past"] = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def run_step(token, index):
        out = model(torch.tensor([[token]]), past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return int(out.logits[0, -1].argmax())

    with torch.no_grad():
        return {**timed_generation(len(ids), args.new_tokens, run_prefill, run_step), "load_s": load_s}


def q8_0_gguf(gguf: str) -> str:
    """The GGUF requantized to Q8_0 by llama.cpp (llama_model_quantize, allow_requantize), made once beside it."""
    import ctypes

    import llama_cpp

    out = Path(gguf).with_name(Path(gguf).stem.replace("q4_k_m", "") + "q8_0-requantized.gguf")
    if not out.is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        partial = out.with_suffix(".partial")
        if llama_cpp.llama_model_quantize(gguf.encode(), str(partial).encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not requantize {gguf} to Q8_0")
        partial.replace(out)
    return str(out)


def run_llama_cpp(args, ids: list) -> dict:
    from llama_cpp import Llama

    gguf = q8_0_gguf(args.gguf) if args.peer == "llama.cpp-q8_0" else args.gguf
    start = time.perf_counter()
    model = Llama(model_path=gguf, n_threads=args.threads, n_threads_batch=args.threads,
                  n_ctx=len(ids) + args.new_tokens + 8, n_batch=len(ids), logits_all=True, verbose=False)
    load_s = time.perf_counter() - start

    def run_prefill():
        model.reset()
        model.eval(ids)
        return int(model.scores[model.n_tokens - 1].argmax())

    def run_step(token, index):
        model.eval([token])
        return int(model.scores[model.n_tokens - 1].argmax())

    return {**timed_generation(len(ids), args.new_tokens, run_prefill, run_step), "load_s": load_s}


def run_peer(args) -> None:
    ids = prompt_ids(Path(args.model) / "tokenizer.json", args.prompt_tokens)
    if args.peer in LAYOUTS:
        row = run_mindvl(args, ids, args.peer == "mindir")
    elif args.peer == "transformers":
        row = run_transformers(args, ids)
    else:
        row = run_llama_cpp(args, ids)
    print("RESULT " + json.dumps(row))


# ----------------------------------------------------------------------------- the machine

def bandwidth_gb_s(threads: int) -> dict:
    """Read bandwidth: the best of 5 sums over a 1 GiB float32 array (numpy: one thread; torch: `threads`)."""
    import numpy as np

    array = np.ones(2 ** 28, np.float32)
    figures = {}

    def best(call):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return array.nbytes / min(times) / 1e9

    figures["numpy"] = best(array.sum)
    try:
        import torch

        torch.set_num_threads(threads)
        tensor = torch.from_numpy(array)
        figures["torch"] = best(tensor.sum)
    except ImportError:
        pass
    return figures


def weight_bytes(model: Path) -> int:
    """Bytes a float32 decode step reads: every parameter once, the tied embedding twice (one row gathered,
    the whole matrix as the LM head) counted once, as a gather of one row is negligible."""
    config = json.loads((model / "config.json").read_text())
    return int(config["parameters"]) * 4


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a folder of `mindvl convert llm` (default: convert the registry's Gemma 3)")
    parser.add_argument("--gguf", help="the GGUF the peers read (default: the registry's Gemma 3 270M)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--json", help="also write every figure to this file")
    add_plot_option(parser)
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # a child process running one peer
    args = parser.parse_args(argv)
    if args.peer:
        return run_peer(args)

    from mindvl.cells.kernels.machine import describe
    from mindvl.pretrained.llm import convert_gguf, installed_gguf

    machine = describe(os.environ.get('MINDVL_KERNEL_ARCH', 'native'))
    print(f"machine: {machine}; {args.threads} threads per peer")
    args.gguf = args.gguf or str(installed_gguf())
    if not args.model:
        args.model = str(Path.home() / ".cache" / "mindvl" / "llm" / "gemma3-270m")
    for peer in args.peers.split(","):
        folder = layout_folder(args.model, LAYOUTS.get(peer, "float32"))
        if not (Path(folder) / "config.json").is_file():
            convert_gguf(args.gguf, folder, weights=LAYOUTS.get(peer, "float32"))
    rows = {}
    for peer in args.peers.split(","):
        command = [sys.executable, __file__, "--peer", peer, "--model", args.model, "--gguf", args.gguf,
                   "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
                   "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True)
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not result:
            print(f"{peer}: failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        rows[peer] = json.loads(result[-1][len("RESULT "):])
        print(f"{peer}: done", flush=True)
    bandwidth = bandwidth_gb_s(args.threads)
    floor = max(bandwidth.values()) * 1e9 / weight_bytes(Path(args.model))
    print(f"\nGemma 3 270M, prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens (greedy)")
    print(f"memory read bandwidth: {', '.join(f'{k} {v:.1f} GB/s' for k, v in bandwidth.items())}; float32 weights "
          f"{weight_bytes(Path(args.model)) / 1e9:.2f} GB per decode step: floor {floor:.1f} tokens/s")
    print(f"{'peer':<14} {'prefill tok/s':>13} {'decode tok/s':>12} {'vs transformers':>15} {'of floor':>8} "
          f"{'first call s':>12} {'peak RSS GB':>11}  same tokens as mindvl")
    reference = rows.get("transformers", {}).get("decode_tok_s")
    for peer, row in rows.items():
        ratio = f"{row['decode_tok_s'] / reference:.2f}x" if reference else "-"
        of_floor = f"{row['decode_tok_s'] / floor:.0%}" if LAYOUTS.get(peer, peer) in ("float32", "transformers") \
            else "(quantized)"
        same = "yes" if row["tokens"] == rows.get("mindvl", row)["tokens"] else \
            f"first {next(i for i, (a, b) in enumerate(zip(row['tokens'], rows['mindvl']['tokens'])) if a != b)}"
        print(f"{peer:<14} {row['prefill_tok_s']:>13.1f} {row['decode_tok_s']:>12.2f} {ratio:>15} {of_floor:>8} "
              f"{row['first_call_s']:>12.1f} {row['peak_rss_gb']:>11.2f}  {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bandwidth_gb_s": bandwidth, "floor_tok_s": floor, "rows": rows},
                                              indent=2))
    plot_comparison(args.plot, [{"peer": peer, **row} for peer, row in rows.items()], x="peer", series="peer",
                    value={"prefill_tok_s": "prefill tokens/s", "decode_tok_s": "decode tokens/s",
                           "peak_rss_gb": "peak RSS (GB)"}, machine=machine,
                    title=f"Gemma 3 270M: prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, "
                          f"{args.threads} threads (decode floor {floor:.1f} tokens/s)")


if __name__ == "__main__":
    main()
