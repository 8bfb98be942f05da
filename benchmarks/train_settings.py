"""What the training settings of issue 5 cost on this CPU: the tiny recipe for a few steps under each,
side by side in one run (same data, same sample order, same seed).

    python benchmarks/train_settings.py [--data mindvl_data] [--steps 40] [--out runs/settings]

Rows: float32 (the baseline); float16 compute with dynamic loss scaling (amp policy: LayerNorm, softmax
and losses in float32); float32 with every Transformer block recomputed in the backward pass; float32
with 2 accumulated micro-batches per step; uncertainty loss weighting. Columns: samples/s over the steps
after the first (which compiles), the first step's wall time, the mean loss of the last 10 steps,
skipped steps and the final loss scale. Builds the data root when missing.
"""
import argparse
import os

os.environ.setdefault("GLOG_v", "3")

SETTINGS = {
    "float32": [],
    "float16 + loss scaling": ["train.precision.compute=float16"],
    "recompute every block": [f"train.modules.{m}.recompute=[0, 1]" for m in ("vision", "text", "audio", "fusion")],
    "2 micro-batches": ["train.grad_accumulation=2"],
    "uncertainty weighting": ["train.loss_weighting=uncertainty"],
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="mindvl_data")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="runs/settings")
    args = parser.parse_args(argv)

    from mindvl.config import load_config
    from mindvl.data.build.builder import build_dataset
    from mindvl.train import train

    base = [f"data.root={args.data}", f"train.max_steps={args.steps}", "train.log_every=10",
            f"train.checkpoint_every={args.steps}"]
    build_dataset(load_config("tiny", base), progress=True)
    rows = []
    for name, overrides in SETTINGS.items():
        folder = name.split()[0].replace("+", "")
        result = train(load_config("tiny", [*base, f"train.output_dir={args.out}/{folder}", *overrides]))
        rows.append((name, result))
    print(f"\ntiny recipe, {args.steps} steps of 64 samples, {os.cpu_count()} CPU cores")
    print("| setting | samples/s | first step (compile) s | loss, last 10 steps | skipped steps | loss scale |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r.samples_per_second:.1f} | {r.compile_seconds:.1f} | {r.final_losses['loss']:.3f} | "
              f"{r.skipped_steps} | {r.loss_scale:g} |")


if __name__ == "__main__":
    main()
