"""A generative package's decode graphs (GraphCells, as `mindvl serve` runs them) timed at several batch sizes:
how a decode step's cost grows with the streams that share it (the scaling continuous batching gets), for `decode`
and, where the package has it, `decode_wide` (the same step, its products laid out for many rows; the engine runs
it from the package's wide_rows rows), side by side at each size.

    python benchmarks/decode_rows.py --package PKG [--rows 1 4 16] [--repeats 5] [--valid 200]

Every row has `--valid` cache slots valid and writes the next one; the caches are random. Prints the CPU, each
graph's median step at each batch size and its cost against the first size's decode.
"""
import argparse
import os
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> None:
    import mindspore as ms

    from mindvl.cells.kernels.machine import machine_line
    from mindvl.engine.package_graphs import DECODE, DECODE_WIDE, GenerationSpec
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
    graphs = {name: load_graph(package, manifest, name) for name in (DECODE, DECODE_WIDE)
              if name in manifest["graphs"]}
    rng = np.random.default_rng(0)
    first = None
    for rows in args.rows:
        valid = np.zeros((rows, spec.cache_len), np.int32)
        valid[:, :args.valid + 1] = 1
        step = [np.full((rows, 1), value, np.int32) for value in (5, args.valid, args.valid)]
        caches = [(rng.standard_normal((rows, spec.cache_len, spec.kv_width)) * 0.1).astype(np.float32)
                  for _ in range(2 * spec.layers)]
        inputs = [ms.Tensor(a) for a in (*step, valid, *caches)]
        times = {}
        for graph in graphs.values():
            graph(*inputs)[0].asnumpy()  # its first call compiles this batch size
        for _ in range(args.repeats):  # the graphs in turn: a pause of the machine hits both
            for name, graph in graphs.items():
                start = time.perf_counter()
                graph(*inputs)[0].asnumpy()
                times.setdefault(name, []).append(time.perf_counter() - start)
        medians = {name: float(np.median(spent) * 1000) for name, spent in times.items()}
        first = first or medians[DECODE]
        print(f"{manifest['name']}, cache {spec.cache_len}: {rows:3d} rows " + "  ".join(
            f"{name} {median:8.1f} ms a step ({median / first:.2f}x)" for name, median in medians.items()) +
            f"  [against {args.rows[0]} row(s) decode]", flush=True)


if __name__ == "__main__":
    main()
