"""The planner's activation memory against a measurement on this CPU.

    python benchmarks/activation_memory.py [--batches 8 64] [--width 256 --heads 4 --layers 4 --tokens 128]

MindSpore 2.10 keeps no memory statistics on CPU (`mindspore.runtime.max_memory_allocated()` is 0), so
the measurement is the process's peak resident memory (VmHWM): a Transformer stack (cells.transformer,
the block every mindvl encoder uses) runs one forward + backward in graph mode in a fresh process per
batch size, and the growth of the peak between two batch sizes, per sample, is what the activations
(and the few batch-sized tensors around them: input, output and their gradients) cost. The planner's
prediction for the same stack: layers x block_activation_bytes + 4 batch-sized (s, w) tensors.
"""
import argparse
import json
import subprocess
import sys


def measure(width: int, heads: int, layers: int, tokens: int, batch: int) -> int:
    """Peak resident bytes of a fresh process that runs the stack's forward + backward once at `batch`."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from mindvl.cells.transformer import TransformerStack
    from mindvl.config import EncoderConfig

    class Loss(nn.Cell):
        def __init__(self, stack):
            super().__init__()
            self.stack = stack

        def construct(self, x):
            return self.stack(x, None).sum()

    ms.set_context(mode=ms.GRAPH_MODE)
    stack = TransformerStack(EncoderConfig(width=width, layers=layers, heads=heads))
    step = ms.value_and_grad(Loss(stack), 0, None)
    x = ms.Tensor(np.random.default_rng(0).normal(size=(batch, tokens, width)).astype(np.float32))
    for _ in range(2):
        loss, grad = step(x)
        grad.asnumpy()
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return peak_kb * 1024


def predicted(width: int, heads: int, layers: int, tokens: int) -> float:
    from mindvl.parallel.planner import StackShape
    from mindvl.parallel.strategy import RecomputeConfig

    shape = StackShape("stack", width, width, 4 * width, heads, layers, tokens, 1, True, False, 0)
    return layers * shape.block_activation_bytes(1, 4, 4, RecomputeConfig()) + 4 * tokens * width * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs=2, default=[8, 64])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # the child: one batch size
    args = parser.parse_args()
    shape = (args.width, args.heads, args.layers, args.tokens)
    if args.measure:
        print(json.dumps(measure(*shape, args.measure)))
        return
    peaks = {}
    for batch in args.batches:
        child = subprocess.run([sys.executable, __file__, "--measure", str(batch), "--width", str(args.width),
                                "--heads", str(args.heads), "--layers", str(args.layers), "--tokens", str(args.tokens)],
                               capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(child.stderr[-2000:])
        peaks[batch] = json.loads(child.stdout.strip().splitlines()[-1])
    low, high = args.batches
    measured = (peaks[high] - peaks[low]) / (high - low)
    want = predicted(*shape)
    if args.json:
        print(json.dumps({"peaks": peaks, "measured_per_sample": measured, "predicted_per_sample": want,
                          "ratio": measured / want}))
        return
    print(f"stack width {args.width}, heads {args.heads}, layers {args.layers}, tokens {args.tokens}; peak RSS "
          f"{peaks[low] / 2**20:.0f} MB at batch {low}, {peaks[high] / 2**20:.0f} MB at batch {high}")
    print(f"per sample: measured {measured / 2**20:.2f} MB, planner {want / 2**20:.2f} MB, "
          f"measured / planner {measured / want:.2f}")


if __name__ == "__main__":
    main()
