"""The generation serving benchmark: time to first token and decode tokens/s per stream at 1, 4 and 16
concurrent streams, continuous batching on and off, in one run, for a generative model package.

    python benchmarks/serving_generate.py --package PKG [--data DATA] [--streams 1 4 16] [--tokens 32]
                                          [--rounds 3] [--json OUT]

The package is deployed into a temporary servable directory (servable `vlm`) and served by a real `mindvl serve`
process per mode: continuous batching on (up to 16 streams share each decode call) and off (`--no-batching`:
one request at a time, in arrival order). The load generator (this process, aiohttp) runs closed-loop streams:
each asks `:generate` with `Accept: text/event-stream` for a test image and its typed question, `--tokens` tokens
greedily with ignore_eos (every answer the same length, as vLLM's benchmarks do), reads the events as they
arrive, then asks again, `--rounds` times. Time to first token: from sending to the first token's event; decode
tokens/s per stream: the tokens after the first over the time they took; aggregate: every token over the wall
time. Goals: 16 streams with continuous batching reach at least 4x the aggregate tokens/s of one stream, and a
time to first token p90 at most 3 s. The streams' first requests arrive together (a burst: the last one waits for
every prefill before it); "later" is the p90 of the requests after each stream's first, which arrive as the
streams' answers end.
"""
import argparse
import asyncio
import base64
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


def request_bodies(data_root: str, tokens: int, count: int = 32) -> List[bytes]:
    from mindvl.data.reading.examples import query_examples

    return [json.dumps({"instances": [{"image": {"b64": base64.b64encode(e.image).decode()}, "text": e.question,
                                       "max_tokens": tokens, "ignore_eos": True}]}).encode()
            for e in query_examples(data_root, count)]


async def stream_once(session, url: str, body: bytes) -> Dict[str, float]:
    start = time.perf_counter()
    first = last = None
    count = 0
    async with session.post(url, data=body, headers={"Accept": "text/event-stream",
                                                     "Content-Type": "application/json"}) as response:
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            now = time.perf_counter()
            first = now if first is None else first
            last = now
            count += 1
    if first is None:
        raise RuntimeError(f"no token came back: {response.status}")
    return {"ttft": first - start, "tokens": count, "decode_s": last - first}


async def run_streams(url: str, bodies: List[bytes], streams: int, rounds: int) -> Dict[str, float]:
    import aiohttp

    results: List[Dict[str, float]] = []

    async def client(session, index: int) -> None:
        for turn in range(rounds):
            result = await stream_once(session, url, bodies[(index * rounds + turn) % len(bodies)])
            results.append({**result, "turn": turn})

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await stream_once(session, url, bodies[0])  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(session, i) for i in range(streams)))
        wall = time.perf_counter() - start
    ttft = np.array([r["ttft"] for r in results]) * 1000
    later = np.array([r["ttft"] for r in results if r["turn"] > 0] or [np.nan]) * 1000
    per_stream = np.array([(r["tokens"] - 1) / r["decode_s"] for r in results if r["decode_s"] > 0])
    return {"streams": streams, "requests": len(results), "ttft_ms_p50": float(np.percentile(ttft, 50)),
            "ttft_ms_p90": float(np.percentile(ttft, 90)), "ttft_ms_p90_later": float(np.percentile(later, 90)),
            "decode_tokens_per_s_per_stream": float(per_stream.mean()),
            "aggregate_tokens_per_s": float(sum(r["tokens"] for r in results) / wall)}


def main(argv=None) -> None:
    from mindvl.cells.kernels.machine import machine_line
    from mindvl.package_reader import read_manifest
    from mindvl.serving.servable import deploy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="a generative model package (mindvl export of a vlm run)")
    parser.add_argument("--data", default=None, help="the data root of the test questions (default: the package's)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer (ignore_eos)")
    parser.add_argument("--rounds", type=int, default=3, help="requests per stream")
    parser.add_argument("--json", default=None, help="also write the results here")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    machine = machine_line()
    print(f"machine: {machine}", flush=True)
    package = Path(args.package)
    data_root = args.data or json.loads((package / "config.json").read_text())["data"]["root"]
    bodies = request_bodies(data_root, args.tokens)
    manifest = read_manifest(package)
    print(f"package {manifest['name']}: {manifest['parameters']:,} parameters, cache {manifest['generation']['cache_len']}"
          f" tokens, buckets {manifest['generation']['buckets']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        servables = Path(folder) / "servables"
        deploy(package, servables, "vlm")
        settings = SimpleNamespace(workers=4, max_batch_size=max(args.streams), max_wait_ms=2.0)
        for batching in (True, False):
            server, url = start_server(servables, settings, batching)
            try:
                for streams in args.streams:
                    row = {"continuous_batching": batching,
                           **asyncio.run(run_streams(f"{url}/model/vlm:generate", bodies, streams, args.rounds))}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                server.terminate()
                server.wait(timeout=30)
    base = {r["continuous_batching"]: r["aggregate_tokens_per_s"] for r in rows if r["streams"] == min(args.streams)}
    print("\n| batching | streams | TTFT p50 ms | TTFT p90 ms | TTFT p90 later ms | decode tok/s per stream | "
          "aggregate tok/s | vs 1 stream |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['continuous_batching'] else 'off'} | {r['streams']} | {r['ttft_ms_p50']:.1f} | "
              f"{r['ttft_ms_p90']:.1f} | {r['ttft_ms_p90_later']:.1f} | {r['decode_tokens_per_s_per_stream']:.1f} | "
              f"{r['aggregate_tokens_per_s']:.1f} |"
              f" {r['aggregate_tokens_per_s'] / base[r['continuous_batching']]:.2f}x |")
    top = max(args.streams)
    gain = next(r["aggregate_tokens_per_s"] for r in rows if r["continuous_batching"] and r["streams"] == top) \
        / base[True]
    p90 = next(r["ttft_ms_p90"] for r in rows if r["continuous_batching"] and r["streams"] == top)
    print(f"\ngoal: {top} streams with continuous batching >= 4x one stream's aggregate tokens/s: {gain:.2f}x "
          f"({'met' if gain >= 4 else 'NOT met'}); TTFT p90 <= 3 s: {p90 / 1000:.1f} s ({'met' if p90 <= 3000 else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "gain": gain}, indent=2))
    plot_comparison(args.plot, rows, x="streams", kind="line", machine=machine,
                    series=lambda r: f"continuous batching {'on' if r['continuous_batching'] else 'off'}",
                    value={"aggregate_tokens_per_s": "aggregate tokens/s",
                           "ttft_ms_p50": "time to first token p50 (ms)"},
                    title=f"mindvl serve generate, {manifest['name']}: {args.tokens} tokens an answer")


if __name__ == "__main__":
    main()
