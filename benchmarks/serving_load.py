"""Issue 7's serving benchmark: throughput and p50/p99 latency of `mindvl serve` at 1, 8 and 64 concurrent
clients, dynamic batching off and on, in one run.

    python benchmarks/serving_load.py --package PKG [--data mindvl_data] [--clients 1 8 64] [--seconds 10]
                                      [--max-batch-size 16] [--max-wait-ms 2] [--workers 4] [--json OUT]

The package is deployed into a temporary servable directory and served by a real `mindvl serve` process
per mode; the load generator (this process, aiohttp) runs closed-loop clients: each sends its next
`predict` (a test image as b64 PNG bytes + its typed question, rotating over the test split) as soon as
its previous answer arrives. A client that gets an error_msg counts an error. The mean executed batch
comes from the server's own /metrics histogram. Goal: with batching, 64 clients get at least 4x the
single-client throughput, with p99 latency no worse than 2x the single-client latency.
"""
import argparse
import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

os.environ.setdefault("GLOG_v", "3")


def request_bodies(data_root: str, method: str, count: int = 64) -> List[bytes]:
    """Bodies for the first `count` test examples: predict gets the image as b64 bytes and the question
    typed, embed_text the question, embed_image the image."""
    from mindvl.data.examples import query_examples

    bodies = []
    for example in query_examples(data_root, count):
        image = {"b64": base64.b64encode(example.image).decode()}
        instance = {"predict": {"image": image, "question": example.question, "audio": {"b64": ""}},
                    "embed_text": {"text": example.question}, "embed_image": {"image": image}}[method]
        bodies.append(json.dumps({"instances": [instance]}).encode())
    return bodies


def start_server(servable_dir: Path, args, batching: bool) -> (subprocess.Popen, str):
    command = [sys.executable, "-m", "mindvl.cli", "serve", "--servable-dir", str(servable_dir), "--port", "0",
               "--grpc-port", "-1", "--workers", str(args.workers), "--max-batch-size", str(args.max_batch_size),
               "--max-wait-ms", str(args.max_wait_ms), "--poll-s", "0", *([] if batching else ["--no-batching"])]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in server.stdout:
        output.append(line)
        found = re.search(r"REST (http://\S+?),? ", line)
        if found:
            return server, found.group(1).rstrip(",;")
    raise RuntimeError("mindvl serve ended before listening:\n" + "".join(output[-30:]))


async def load(url: str, method: str, bodies: List[bytes], clients: int, seconds: float) -> Dict[str, float]:
    """Closed-loop clients for `seconds` (after a short warm-up); -> throughput, latency percentiles, errors."""
    import aiohttp

    latencies: List[float] = []
    errors = 0
    stop_at = 0.0

    async def client(session, index: int) -> None:
        nonlocal errors
        turn = index
        while time.perf_counter() < stop_at:
            body = bodies[turn % len(bodies)]
            turn += clients
            start = time.perf_counter()
            async with session.post(f"{url}/model/vqa:{method}", data=body) as reply:
                answer = await reply.json()
            if "error_msg" in answer or any("error_msg" in item for item in answer["instances"]):
                errors += 1
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop_at = time.perf_counter() + 1.0  # warm-up: connections open, batch buckets met
        await asyncio.gather(*(client(session, i) for i in range(clients)))
        latencies.clear()
        errors = 0
        started = time.perf_counter()
        stop_at = started + seconds
        await asyncio.gather(*(client(session, i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    milliseconds = np.asarray(latencies) * 1000
    return {"method": method, "clients": clients, "requests": len(latencies), "throughput": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(milliseconds, 50)), "p99_ms": float(np.percentile(milliseconds, 99)),
            "errors": errors}


def batch_totals(url: str) -> (float, float):
    """(instances, batches) executed so far, from the server's mindvl_batch_size histogram."""
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    return tuple(sum(float(v) for v in re.findall(rf"^mindvl_batch_size_{part}\{{.*\}} (\S+)$", text, re.M))
                 for part in ("sum", "count"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, help="a model package with the vqa graph (mindvl export)")
    parser.add_argument("--data", default="mindvl_data", help="data set whose test split supplies the requests")
    parser.add_argument("--methods", nargs="+", default=["predict", "embed_text"],
                        choices=["predict", "embed_text", "embed_image"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per point")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)

    from mindvl.serving.servable import deploy

    bodies = {method: request_bodies(args.data, method) for method in args.methods}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        servables = Path(folder)
        deploy(args.package, servables, "vqa")
        for batching in (False, True):
            server, url = start_server(servables, args, batching)
            try:
                for method in args.methods:
                    for clients in args.clients:
                        before = batch_totals(url)
                        row = asyncio.run(load(url, method, bodies[method], clients, args.seconds))
                        instances, batches = (after - b for after, b in zip(batch_totals(url), before))
                        row.update(batching=batching, mean_batch=instances / batches if batches else 1.0)
                        rows.append(row)
                        print(f"{method} batching {'on ' if batching else 'off'} {clients:3d} clients: "
                              f"{row['throughput']:7.1f} req/s  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} "
                              f"ms  mean batch {row['mean_batch']:4.1f}  errors {row['errors']}", flush=True)
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=60)

    print("\n| method | batching | clients | throughput (req/s) | p50 (ms) | p99 (ms) | mean batch | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in sorted(rows, key=lambda r: (args.methods.index(r["method"]), r["batching"], r["clients"])):
        print(f"| {row['method']} | {'on' if row['batching'] else 'off'} | {row['clients']} | {row['throughput']:.1f} | "
              f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['mean_batch']:.1f} | {row['errors']} |")
    for method in args.methods:
        on = {row["clients"]: row for row in rows if row["batching"] and row["method"] == method}
        off = {row["clients"]: row for row in rows if not row["batching"] and row["method"] == method}
        if 1 in on and max(on) > 1:
            top, most = on[max(on)], max(on)
            print(f"{method}, batching on, {most} clients: {top['throughput'] / on[1]['throughput']:.1f}x the "
                  f"single-client throughput and {top['throughput'] / off[most]['throughput']:.1f}x batching off "
                  f"(goal >= 4x); p99 {top['p99_ms'] / on[1]['p50_ms']:.1f}x the single-client latency (goal <= 2x)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
