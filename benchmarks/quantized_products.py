"""What a weight-only INT8 / INT4 product costs beside the float32 one, at the shapes of a Gemma 3 270M decode step
and prefill (issue 51): per shape, the median milliseconds of

    float32   MindSpore's MatMul (standard) and mindvl's FusedMatMul (one sgemm per worker)
    int8      Int8Product (the standard graph: the whole weight widened, then MatMul: what exports hold) and
              FusedInt8MatMul (cells/kernels/quantized_matmul.cc: the int8 weights read as they are), per channel
              and in groups of 32 (a GGUF's Q8_0 / Q5_0)
    int4      Int4Product (standard) and FusedInt4MatMul, groups of 32 with a minimum (Q4_0 / Q4_K)

each a graph-mode cell called on the same inputs, and the megabytes of weights each reads. One run per kernel
build: the native one and, with --arch x86-64-v3, the AVX2 + FMA code an AVX2-only machine runs.

    python benchmarks/quantized_products.py [--arch native|x86-64-v3] [--repeats 30] [--json OUT]
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
    from mindvl.cells.kernels.cpu import FusedInt4MatMul, FusedInt8MatMul, FusedMatMul
    from mindvl.cells.kernels.machine import cpu_model, isa_flags, kernel_threads, machine_kind
    from mindvl.cells.quant import Int4Product, Int8Product, quantize_int4, quantize_int8

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
    columns = ("f32 MatMul", "f32 fused", "int8 std", "int8 fused", "int8/32 fused", "int4 std", "int4 fused")
    print(f"{'shape':<38} " + " ".join(f"{c:>13}" for c in columns) + "   MB f32 / int8 / int4")
    for rows, width, out, what in SHAPES:
        weight = rng.normal(size=(out, width)).astype(np.float32)
        int8 = [ms.Tensor(t) for t in quantize_int8(weight)]
        grouped = [ms.Tensor(t) for t in quantize_int8(weight, 32)]
        int4 = [ms.Tensor(t) for t in quantize_int4(weight)]
        x = ms.Tensor(rng.normal(size=(rows, width)).astype(np.float32))
        w = ms.Tensor(weight)
        times = [timed(Standard(), (x, w), args.repeats), timed(FusedMatMul(path), (x, w), args.repeats),
                 timed(Int8Product(), (x, *int8), args.repeats), timed(FusedInt8MatMul(path), (x, *int8), args.repeats),
                 timed(FusedInt8MatMul(path), (x, *grouped), args.repeats),
                 timed(Int4Product(), (x, *int4), args.repeats), timed(FusedInt4MatMul(path), (x, *int4), args.repeats)]
        sizes = [weight.nbytes / 2 ** 20] + [sum(t.nbytes for t in stored) / 2 ** 20 for stored in (int8, int4)]
        row = {"shape": what, "rows": rows, "in": width, "out": out, **dict(zip(columns, times)),
               "float32_mb": sizes[0], "int8_mb": sizes[1], "int4_mb": sizes[2]}
        rows_out.append(row)
        print(f"{what:<38} " + " ".join(f"{t:>13.3f}" for t in times) + "   " + " / ".join(f"{m:.1f}" for m in sizes))
        del weight, w
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
