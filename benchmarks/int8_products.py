"""What a weight-only INT8 product costs beside the float32 one, at the shapes of a Gemma 3 270M decode step and
prefill (issue 51): per shape, the median milliseconds of

    float32   MindSpore's MatMul (standard) and mindvl's FusedMatMul (one sgemm per worker)
    int8      Int8Product (the standard graph: the whole weight widened, then MatMul: what exports hold) and
              FusedInt8MatMul (cells/kernels/int8_matmul.cc: the int8 weights read as they are)

each a graph-mode cell called on the same inputs, and the bytes of weights each reads. One run per kernel build:
the native one and, with --arch x86-64-v3, the AVX2 + FMA code an AVX2-only machine runs.

    python benchmarks/int8_products.py [--arch native|x86-64-v3] [--repeats 30] [--json OUT]
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

SHAPES = [  # (rows, in, out, what)
    (1, 640, 1024, "decode q (4 heads x 256)"), (1, 640, 2048, "decode gate/up"), (1, 2048, 640, "decode down"),
    (1, 640, 262144, "decode LM head (tied, 262,144 rows)"), (128, 640, 2048, "prefill 128 gate/up"),
    (128, 2048, 640, "prefill 128 down"),
]


def timed(cell, inputs, repeats: int) -> float:
    for _ in range(3):
        cell(*inputs).asnumpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        cell(*inputs).asnumpy()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="native")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    import mindspore as ms
    from mindspore import nn, ops

    from mindvl.cells.kernels import library
    from mindvl.cells.kernels.cpu import FusedInt8MatMul, FusedMatMul
    from mindvl.cells.kernels.machine import cpu_model, isa_flags, kernel_threads, machine_kind
    from mindvl.cells.quant import Int8Product, quantize_per_channel

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    path = library(args.arch)
    print(f"machine: {cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores; kernel "
          f"build {args.arch}, {kernel_threads()} kernel threads")

    class Standard(nn.Cell):
        def __init__(self):
            super().__init__()
            self.matmul = ops.MatMul(transpose_b=True)

        def construct(self, x, w):
            return self.matmul(x, w)

    rng = np.random.default_rng(0)
    rows_out = []
    print(f"{'shape':<38} {'f32 MatMul':>10} {'f32 fused':>10} {'int8 std':>9} {'int8 fused':>10} {'f32 MB':>7} "
          f"{'int8 MB':>8}")
    for rows, width, out, what in SHAPES:
        weight = rng.normal(size=(out, width)).astype(np.float32)
        q, scale = quantize_per_channel(weight)
        x = ms.Tensor(rng.normal(size=(rows, width)).astype(np.float32))
        w, wq, ws = ms.Tensor(weight), ms.Tensor(q, ms.int8), ms.Tensor(scale)
        row = {"shape": what, "rows": rows, "in": width, "out": out,
               "float32_matmul_ms": timed(Standard(), (x, w), args.repeats),
               "float32_fused_ms": timed(FusedMatMul(path), (x, w), args.repeats),
               "int8_standard_ms": timed(Int8Product(), (x, wq, ws), args.repeats),
               "int8_fused_ms": timed(FusedInt8MatMul(path), (x, wq, ws), args.repeats),
               "float32_mb": weight.nbytes / 2 ** 20, "int8_mb": (q.nbytes + scale.nbytes) / 2 ** 20}
        rows_out.append(row)
        print(f"{what:<38} {row['float32_matmul_ms']:>10.3f} {row['float32_fused_ms']:>10.3f} "
              f"{row['int8_standard_ms']:>9.3f} {row['int8_fused_ms']:>10.3f} {row['float32_mb']:>7.1f} "
              f"{row['int8_mb']:>8.1f}")
        del weight, w
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
