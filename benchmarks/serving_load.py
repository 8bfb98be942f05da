"""The serving benchmark: throughput and p50/p99 latency of `mindvl serve` at 1, 8 and 64 concurrent
clients, dynamic batching off and on, in one run, for a mindvl package and an unmodified MindSpore
Serving servable side by side.

    python benchmarks/serving_load.py --package PKG [--data mindvl_data] [--methods ...] [--clients 1 8 64]
                                      [--seconds 10] [--max-batch-size 16] [--max-wait-ms 2] [--workers 4]
                                      [--json OUT]

The package is deployed into a temporary servable directory (servable `vqa`, its generated config), next to
servable `mindspore_serving`: the package's image_embed MindIR file as a bare version folder and a
servable_config.py written as a MindSpore Serving user writes one (MindData `c_transforms` preprocessing,
declare_model, add_stage), served unmodified. One real `mindvl serve` process per mode; the load generator
(this process, aiohttp) runs closed-loop clients: each sends its next request (a test image as b64 PNG
bytes, and its typed question for predict, rotating over the test split) as soon as its previous answer
arrives. A client that gets an error_msg counts an error. The mean executed batch comes from the server's
own /metrics histogram. Goals: with batching, 64 clients get at least 4x the single-client throughput, and
batching halves the p99 latency at 64 clients. (p99 within 2x of one client's latency cannot hold for
closed-loop clients: each waits for its answer, so latency >= clients / throughput, Little's law.)
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
from typing import Dict, List, Sequence

import numpy as np

from mindvl.plots.benchmarks import add_plot_option, plot_comparison

os.environ.setdefault("GLOG_v", "3")

# what each --methods name asks: (servable, method)
TARGETS = {"predict": ("vqa", "predict"), "embed_text": ("vqa", "embed_text"), "embed_image": ("vqa", "embed_image"),
           "unmodified_embed_image": ("mindspore_serving", "embed_image")}

# A servable_config.py as a MindSpore Serving 2.0 user writes one for an image-embedding MindIR: MindData
# eager preprocessing, a model with a batch dimension. Served by mindvl without edits.
MINDSPORE_SERVABLE = """
import mindspore.dataset.vision.c_transforms as VC
from mindspore_serving.server import register

model = register.declare_model(model_file="{file}", model_format="MindIR", with_batch_dim=True)


def preprocess(image):
    image = VC.Decode()(image)
    image = VC.Resize([{size}, {size}])(image)
    image = VC.Normalize(mean={mean}, std={std})(image)
    return VC.HWC2CHW()(image)


@register.register_method(output_names=["embedding"])
def embed_image(image):
    x = register.add_stage(preprocess, image, outputs_count=1)
    embedding = register.add_stage(model, x, outputs_count=1)
    return embedding
"""


def write_mindspore_servable(package: Path, servables: Path) -> None:
    """Servable `mindspore_serving`: the package's image_embed graph as a bare MindIR file, and the config above."""
    import shutil

    from mindvl.package_reader import read_manifest

    manifest = read_manifest(package)
    if "image_embed" not in manifest["graphs"]:
        raise SystemExit(f"{package}: has no image_embed graph; export it (mindvl export --graphs ...) or leave "
                         f"unmodified_embed_image out of --methods")
    file = manifest["graphs"]["image_embed"]["file"]
    pre = manifest["preprocess"]
    folder = servables / "mindspore_serving"
    (folder / "1").mkdir(parents=True)
    shutil.copy2(package / file, folder / "1" / Path(file).name)
    (folder / "servable_config.py").write_text(MINDSPORE_SERVABLE.format(
        file=Path(file).name, size=pre["image_size"], mean=[m * 255 for m in pre["image_mean"]],
        std=[s * 255 for s in pre["image_std"]]))


def request_bodies(data_root: str, method: str, count: int = 64) -> List[bytes]:
    """Bodies for the first `count` test examples: predict gets the image as b64 bytes and the question
    typed, embed_text the question, embed_image (either servable) the image."""
    from mindvl.data.reading.examples import query_examples

    bodies = []
    for example in query_examples(data_root, count):
        image = {"b64": base64.b64encode(example.image).decode()}
        instance = {"predict": {"image": image, "question": example.question, "audio": {"b64": ""}},
                    "embed_text": {"text": example.question}}.get(TARGETS[method][1], {"image": image})
        bodies.append(json.dumps({"instances": [instance]}).encode())
    return bodies


def start_server(servable_dir: Path, args, batching: bool, flags: Sequence[str] = ()) -> (subprocess.Popen, str):
    command = [sys.executable, "-m", "mindvl.cli", "serve", "--servable-dir", str(servable_dir), "--port", "0",
               "--grpc-port", "-1", "--workers", str(args.workers), "--max-batch-size", str(args.max_batch_size),
               "--max-wait-ms", str(args.max_wait_ms), "--poll-s", "0", *([] if batching else ["--no-batching"]),
               *flags]
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
            async with session.post(f"{url}/model/{':'.join(TARGETS[method])}", data=body) as reply:
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
    parser.add_argument("--methods", nargs="+", default=["predict", "embed_text", "embed_image",
                                                         "unmodified_embed_image"], choices=list(TARGETS),
                        help="unmodified_embed_image: the package's image_embed graph in a MindSpore Serving "
                             "servable folder, served unmodified")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per point")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", help="also write the rows here")
    add_plot_option(parser)
    args = parser.parse_args(argv)

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind
    from mindvl.serving.servable import deploy

    machine = f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores"
    print(f"machine: {machine}", flush=True)
    bodies = {method: request_bodies(args.data, method) for method in args.methods}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        servables = Path(folder)
        deploy(args.package, servables, "vqa")
        if "unmodified_embed_image" in args.methods:
            write_mindspore_servable(Path(args.package), servables)
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
                  f"single-client throughput (goal >= 4x), {top['throughput'] / off[most]['throughput']:.1f}x "
                  f"batching off; p99 {top['p99_ms']:.1f} ms against {off[most]['p99_ms']:.1f} ms batching off: "
                  f"{top['p99_ms'] / off[most]['p99_ms']:.2f}x (goal <= 0.5x)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    plot_comparison(args.plot, rows, x="clients", kind="line", log=True, machine=machine,
                    series=lambda r: f"{r['method']}, batching {'on' if r['batching'] else 'off'}",
                    value={"throughput": "requests/s", "p99_ms": "p99 latency (ms)"},
                    title=f"mindvl serve, closed-loop clients, {args.seconds:g} s a point")


if __name__ == "__main__":
    main()
