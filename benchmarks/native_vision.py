"""Packed native-resolution images against one padded image per slot: the vision tower's training step (forward
and backward, graph mode) on a batch of images of different sizes, two ways, each in a process of its own:

  packed   every image's patches on one sequence, padded to a multiple of 64; block-diagonal masks per frame and
           per window (mindvl.engine.vision_layout): no padding inside an image, but each layer's attention is one
           dense (S x S) product masked (MindSpore's CPU kernels have no variable-length attention)
  rows     packed, each window padded to a full row of 64 patches: the windowed layers run over (windows, 64)
           rows, only the full-attention layers over the whole sequence
  padded   a batch of images, each padded to the largest's patch count: (N, S_max); per image its own masks

It prints the step time (median of --steps after a warm-up) and the process's peak RSS for each, and the CPU.
The seed (MindSpeed-MLLM) reports -42% memory from packing with a variable-length flash kernel on Ascend.

    python benchmarks/native_vision.py [--width 256] [--layers 4] [--heads 4] [--steps 5]
                                       [--sizes 224x224 448x336 336x336 112x448 560x420 280x280]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")
MODES = ("packed", "rows", "padded")


def images(sizes, config):
    """Random patches and grids of images of `sizes` ("WxH"), resized as the family's processor would."""
    from mindvl.preprocess.native_resolution import smart_resize

    rng = np.random.default_rng(0)
    out = []
    for size in sizes:
        width, height = (int(v) for v in size.split("x"))
        h, w = smart_resize(height, width, config)
        grid = (1, h // 14, w // 14)
        out.append((rng.standard_normal((int(np.prod(grid)), config.patch_values)).astype(np.float32), grid))
    return out


def run(mode: str, args) -> dict:
    import mindspore as ms
    from mindspore import nn, ops

    from mindvl.cells.native_vision import NativeVisionTower
    from mindvl.engine.vision_layout import vision_layout
    from mindvl.preprocess.native_resolution import PatchConfig

    ms.set_context(mode=ms.GRAPH_MODE)
    config = PatchConfig(max_pixels=28 * 28 * 1280)
    batch = images(args.sizes, config)
    tower = NativeVisionTower(args.width, args.layers, args.heads, args.width * 3, args.width,
                              full_layers=tuple(range(3, args.layers, 4)),  # every 4th (7B: every 8th)
                              window_row=64 if mode == "rows" else 0)
    if mode in ("packed", "rows"):
        layout = vision_layout([g for _, g in batch], 2, 4, window_rows=mode == "rows")
        bucket = -(-layout.patches // 64) * 64
        inputs = layout.graph_inputs(np.concatenate([p for p, _ in batch]), bucket)
        tokens = bucket
    else:
        largest = max(len(p) for p, _ in batch)
        rows = []
        for patches, grid in batch:
            layout = vision_layout([grid], 2, 4)
            row = layout.graph_inputs(patches, largest)
            rows.append(row)
        inputs = tuple(np.concatenate([r[i] for r in rows]) for i in range(4)) + (np.arange(largest // 4, dtype=np.int32),)
        tokens = largest * len(batch)

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.tower = tower

        def construct(self, *x):
            return ops.reduce_mean(self.tower(*x) ** 2)

    step = ms.value_and_grad(Loss(), None, tower.trainable_params())
    tensors = [ms.Tensor(a) for a in inputs]
    step(*tensors)  # compile and warm up
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss, grads = step(*tensors)
        float(loss.asnumpy())
        times.append(time.perf_counter() - start)
    real = sum(len(p) for p, _ in batch)
    return {"mode": mode, "patches": real, "computed_tokens": tokens, "step_s": float(np.median(times)),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", default=["224x224", "448x336", "336x336", "112x448", "560x420",
                                                       "280x280"])
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one measurement, internal
    args = parser.parse_args(argv)
    if args.mode:
        print(json.dumps(run(args.mode, args)))
        return
    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind

    print(f"machine: {cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores")
    print(f"tower: width {args.width}, {args.layers} layers, {args.heads} heads; images {' '.join(args.sizes)}")
    rows = []
    for mode in MODES:
        command = [sys.executable, __file__, "--mode", mode, "--width", str(args.width), "--layers", str(args.layers),
                   "--heads", str(args.heads), "--steps", str(args.steps), "--sizes", *args.sizes]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("\n| layout | patches | tokens computed | step (s) | peak RSS (MB) |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['mode']} | {row['patches']} | {row['computed_tokens']} | {row['step_s']:.3f} | "
              f"{row['peak_rss_mb']:.0f} |")
    padded = rows[-1]
    for row in rows[:-1]:
        print(f"{row['mode']} vs padded: step {row['step_s'] / padded['step_s'] - 1:+.0%}, peak RSS "
              f"{row['peak_rss_mb'] / padded['peak_rss_mb'] - 1:+.0%}")


if __name__ == "__main__":
    main()
