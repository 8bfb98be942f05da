"""A generative package's decode graph (GraphCell, as `mindvl serve` runs it) timed at several batch sizes: how
a decode step's cost grows with the streams that share it (the scaling continuous batching gets).

    python benchmarks/decode_rows.py --package PKG [--rows 1 4 16] [--repeats 5] [--valid 200]

Every row has `--valid` cache slots valid and writes the next one; the caches are random. Prints the CPU, each
batch size's median step and its cost against batch 1.
"""
import argparse
import os
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> None:
    import mindspore as ms

    from mindvl.cells.kernels.machine import machine_line
    from mindvl.engine.package_graphs import DECODE, GenerationSpec
    from mindvl.package_reader import load_graph, read_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--valid", type=int, default=200, help="valid cache slots per row")
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOG_v", "3")
    print(f"machine: {machine_line()}", flush=True)
    package = Path(args.package)
    manifest = read_manifest(package)
    spec = GenerationSpec.from_manifest(manifest)
    graph = load_graph(package, manifest, DECODE)
    rng = np.random.default_rng(0)
    first = None
    for rows in args.rows:
        valid = np.zeros((rows, spec.cache_len), np.int32)
        valid[:, :args.valid + 1] = 1
        step = [np.full((rows, 1), value, np.int32) for value in (5, args.valid, args.valid)]
        caches = [(rng.standard_normal((rows, spec.cache_len, spec.kv_width)) * 0.1).astype(np.float32)
                  for _ in range(2 * spec.layers)]
        inputs = [ms.Tensor(a) for a in (*step, valid, *caches)]
        graph(*inputs)[0].asnumpy()  # its first call compiles this batch size
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            graph(*inputs)[0].asnumpy()
            times.append(time.perf_counter() - start)
        median = float(np.median(times) * 1000)
        first = first or median
        print(f"{manifest['name']} decode, cache {spec.cache_len}: {rows:3d} rows {median:8.1f} ms a step, "
              f"{median / first:.2f}x batch {args.rows[0]}", flush=True)


if __name__ == "__main__":
    main()
