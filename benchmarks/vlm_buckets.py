"""Compile time, step time, samples/s and peak memory per packing bucket of a generative recipe's training, on
this CPU: the real Trainer (`mindvl train`'s TrainStep, the recipe's kernels, frozen encoders' token cache)
over the recipe's own data stream, each optimizer step's time recorded under its batch's shape.

    python benchmarks/vlm_buckets.py --config vlm-s --set data.root=R --set model.pretrained.vision=DIR \\
        --set model.pretrained.audio=DIR --set model.pretrained.decoder=DIR [--steps 40]
    python benchmarks/vlm_buckets.py --config vlm-tiny --set data.root=R --set train.init_from=RUN

Graph mode compiles one graph per input shape. A generative batch's shape is its bucket: the packed rows
(ConversationPacker's row buckets, data.packing.length tokens each) and the labelled positions the LM head
runs at (its label buckets). The first step of a bucket pays its compilation; the later ones are its step
time. Peak RSS is the process's high-water mark (VmHWM) after that bucket's first step, so it grows as
buckets are met; the whole run's peak is the last. Buckets the steps did not meet are listed as such (the
largest row bucket, one conversation a row, is rare: it exists so that any batch has a shape).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def vm_hwm_gb() -> float:
    """This process's peak resident memory so far (/proc/self/status VmHWM), GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def measure(config: str, overrides, steps: int) -> dict:
    """Train `steps` steps of `config`, timing each optimizer step under its (rows, labels) bucket."""
    from mindvl.config import load_config
    from mindvl.train import Trainer, TrainingArguments, create_model

    out = tempfile.mkdtemp(prefix="vlm_buckets_")
    cfg = load_config(config, [*overrides, f"train.output_dir={out}", f"train.max_steps={steps}",
                               f"train.checkpoint_every={steps}", "train.eval_every=0", "train.warmup_steps=1"])
    start = time.perf_counter()
    trainer = Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))
    setup_s = time.perf_counter() - start
    columns = trainer.stream.columns
    ids, labels = columns.index("ids"), columns.index("labels")
    step = trainer.train_step
    buckets = {}

    def timed(apply, *batch):
        key = (int(batch[ids].shape[0]), int(batch[labels].shape[0]))
        begin = time.perf_counter()
        outputs = step(apply, *batch)
        outputs[0].asnumpy()  # the step has run
        seconds = time.perf_counter() - begin
        seen = buckets.setdefault(key, {"first_s": seconds, "steps_s": [], "peak_rss_gb": vm_hwm_gb()})
        if seen["first_s"] != seconds:
            seen["steps_s"].append(seconds)
        return outputs

    trainer.train_step = timed
    result = trainer.train()
    packer = trainer.stream.packer
    return {"config": config, "setup_s": round(setup_s, 1), "token_cache_s": result.token_cache_seconds,
            "micro_batch": trainer.stream.micro_batch_size, "length": packer.length,
            "row_buckets": list(packer.row_buckets), "label_buckets": list(packer.label_buckets),
            "buckets": {f"{rows}x{labels}": value for (rows, labels), value in sorted(buckets.items())},
            "peak_rss_gb": round(vm_hwm_gb(), 2)}


def render(report: dict) -> str:
    batch = report["micro_batch"]
    lines = [f"{report['config']}: micro-batch {batch} conversations, rows of {report['length']} tokens; row buckets "
             f"{report['row_buckets']}, label buckets {report['label_buckets']}; setup {report['setup_s']} s "
             f"(token cache {report['token_cache_s']} s)",
             f"{'rows x labels':>13} {'steps':>5} {'compile + 1st s':>15} {'step s':>7} {'samples/s':>9} "
             f"{'peak RSS GB':>11}"]
    for name, value in report["buckets"].items():
        steps = value["steps_s"]
        median = sorted(steps)[len(steps) // 2] if steps else float("nan")
        lines.append(f"{name:>13} {len(steps) + 1:>5} {value['first_s']:>15.1f} {median:>7.2f} "
                     f"{batch / median if steps else float('nan'):>9.1f} {value['peak_rss_gb']:>11.2f}")
    met = {tuple(int(x) for x in name.split("x")) for name in report["buckets"]}
    unmet = [f"{r}x{l}" for r in report["row_buckets"] for l in report["label_buckets"] if (r, l) not in met]
    lines.append(f"not met in these steps: {', '.join(unmet) or 'none'}; whole run's peak RSS {report['peak_rss_gb']} GB")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="vlm-tiny")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mindvl.cells.kernels.machine import describe

    print(f"machine: {describe(os.environ.get('MINDVL_KERNEL_ARCH', 'native'))}", flush=True)
    report = measure(args.config, args.overrides, args.steps)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
