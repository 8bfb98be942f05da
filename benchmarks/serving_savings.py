"""The server's generation savings measured: time to first token of prompts that share a long prefix with and
without --prefix-cache-mb, and decode tokens/s with and without --speculative-tokens on prompts that quote their
input and on prompts that do not, in one run, for a generative model package.

    python benchmarks/serving_savings.py --package PKG [--prefix-tokens 512] [--requests 4] [--tokens 48]
                                         [--speculative-tokens 5] [--json OUT] [--plot OUT.png]

Two real `mindvl serve` processes in turn over the same deployed package: plain, then with both savings on. Each
gets the same requests through the OpenAI chat API (streamed, greedy, ignore_eos): `--requests` questions after
one system prompt of about `--prefix-tokens` tokens (the prefix requests share; the saving server's first one
fills its cache and is not counted), then quoting prompts (a paragraph and "repeat it") and open questions.
Every answer must be token for token the plain server's. Goals (issue 51): a request sharing a 512-token prefix
gets its first token in <= 1/4 of the uncached time; speculation >= 1.5x decode tokens/s on quoting prompts and
never more than 5% slower on the others.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import numpy as np

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_load import start_server  # noqa: E402  (the same `mindvl serve` process the serving benchmark runs)

LICENCE = Path("/usr/share/common-licenses")  # real English text on every Debian host (quantized_quality.py's)
QUESTIONS = ["Which licence is this?", "Who may use the software?", "What must a copy keep?",
             "Is there a warranty?", "What is a derivative work?", "Can it be sold?"]
OPEN = ["Describe a sunrise over the sea.", "Give three tips for learning to cook.", "What makes a good friend?",
        "Tell a short story about a cat."]


def paragraphs(count: int) -> List[str]:
    text = (LICENCE / "GPL-3").read_text()
    blocks = [" ".join(b.split()) for b in text.split("\n\n") if 300 < len(" ".join(b.split())) < 700]
    return blocks[:count]


def system_prompt(tokenizer, tokens: int) -> str:
    words = " ".join((LICENCE / "Apache-2.0").read_text().split()).split(" ")
    low, high = 1, len(words)
    while low < high:  # the most words within `tokens` tokens
        middle = (low + high + 1) // 2
        if len(tokenizer.encode(" ".join(words[:middle])).ids) <= tokens:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low])


def stream(client, messages, tokens: int) -> Dict[str, float]:
    start = time.perf_counter()
    first = last = None
    text, count = [], 0
    for chunk in client.chat.completions.create(model="vlm", messages=messages, max_tokens=tokens, stream=True,
                                                extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].delta.content:  # the first chunk's role and an empty content: none
            now = time.perf_counter()
            first = now if first is None else first
            last = now
            text.append(chunk.choices[0].delta.content)
            count += 1
    return {"ttft": first - start, "decode_s": last - first, "chunks": count, "text": "".join(text)}


def measure(url: str, system: str, args) -> Dict[str, list]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    stream(client, [{"role": "user", "content": "Hello."}], 4)  # warm-up: every graph met once
    shared = [stream(client, [{"role": "system", "content": system}, {"role": "user", "content": q}], 8)
              for q in QUESTIONS[:args.requests + 1]]
    quoting = [stream(client, [{"role": "user", "content": f"{p}\n\nRepeat the text above word for word."}],
                      args.tokens) for p in paragraphs(args.requests)]
    open_ended = [stream(client, [{"role": "user", "content": q}], args.tokens) for q in OPEN[:args.requests]]
    return {"shared": shared, "quoting": quoting, "open": open_ended}


def rate(results: List[Dict[str, float]]) -> float:
    return float(sum(r["chunks"] - 1 for r in results) / sum(r["decode_s"] for r in results))


def main(argv=None) -> None:
    from tokenizers import Tokenizer

    from mindvl.cells.kernels.machine import machine_line
    from mindvl.package_reader import read_manifest
    from mindvl.serving.servable import deploy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="a generative model package (mindvl export)")
    parser.add_argument("--prefix-tokens", type=int, default=512, help="the shared system prompt's length")
    parser.add_argument("--requests", type=int, default=4, help="requests of each kind")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per quoting or open answer (ignore_eos)")
    parser.add_argument("--speculative-tokens", type=int, default=5)
    parser.add_argument("--prefix-cache-mb", type=float, default=256.0)
    parser.add_argument("--json", default=None, help="also write the results here")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    machine = machine_line()
    print(f"machine: {machine}", flush=True)
    package = Path(args.package)
    manifest = read_manifest(package)
    spec = manifest["generation"]
    print(f"package {manifest['name']}: {manifest['parameters']:,} parameters, cache {spec['cache_len']} tokens, "
          f"buckets {spec['buckets']}", flush=True)
    system = system_prompt(Tokenizer.from_file(str(package / spec["tokenizer"])), args.prefix_tokens)
    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        servables = Path(folder) / "servables"
        deploy(package, servables, "vlm")
        settings = SimpleNamespace(workers=4, max_batch_size=1, max_wait_ms=2.0)
        for name, flags in (("plain", []), ("savings", ["--prefix-cache-mb", str(args.prefix_cache_mb),
                                                        "--speculative-tokens", str(args.speculative_tokens)])):
            server, url = start_server(servables, settings, True, flags)
            try:
                runs[name] = measure(url, system, args)
            finally:
                server.terminate()
                server.wait(timeout=30)
            print(f"{name}: done", flush=True)
    same = all(a["text"] == b["text"] for kind in runs["plain"]
               for a, b in zip(runs["plain"][kind], runs["savings"][kind]))
    uncached = float(np.median([r["ttft"] for r in runs["plain"]["shared"][1:]]))
    cached = float(np.median([r["ttft"] for r in runs["savings"]["shared"][1:]]))  # the first filled the cache
    rows = [{"measure": "TTFT, shared prefix (s)", "plain": uncached, "savings": cached, "ratio": cached / uncached},
            *({"measure": f"decode tok/s, {kind}", "plain": rate(runs["plain"][kind]),
               "savings": rate(runs["savings"][kind]),
               "ratio": rate(runs["savings"][kind]) / rate(runs["plain"][kind])} for kind in ("quoting", "open"))]
    print(f"\nshared prefix: {args.prefix_tokens} tokens; answers identical on both servers: {same}")
    print("| measure | plain | prefix cache + speculation | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['measure']} | {r['plain']:.3f} | {r['savings']:.3f} | {r['ratio']:.2f}x |")
    goals = [("TTFT with a shared prefix <= 1/4 of uncached", rows[0]["ratio"] <= 0.25),
             ("speculation >= 1.5x on quoting prompts", rows[1]["ratio"] >= 1.5),
             ("speculation >= 0.95x on open prompts", rows[2]["ratio"] >= 0.95)]
    for goal, met in goals:
        print(f"goal: {goal}: {'met' if met else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows, "identical": same,
                                               "runs": runs}, indent=2))
    plot_comparison(args.plot, [{"server": server, **{r["measure"]: r[key] for r in rows}}
                                for server, key in (("plain", "plain"), ("prefix cache + speculation", "savings"))],
                    x="server", series="server", value={r["measure"]: r["measure"] for r in rows}, machine=machine,
                    title=f"mindvl serve, {manifest['name']}: prefix caching and speculative decoding")

if __name__ == "__main__":
    main()
