"""Compile time, step time, samples/s and peak memory per packing bucket of a generative recipe's training, on
this CPU: the real Trainer's TrainStep (`mindvl train`'s graph, the recipe's kernels, the frozen encoders'
token cache) on the recipe's own data stream, its batches packed into each bucket in turn.

    python benchmarks/vlm_buckets.py --config vlm-s --set data.root=R --set model.pretrained.vision=DIR \\
        --set model.pretrained.audio=DIR --set model.pretrained.decoder=DIR [--repeats 4]
    python benchmarks/vlm_buckets.py --config vlm-tiny --set data.root=R --set train.init_from=RUN

Graph mode compiles one graph per input shape. A generative batch's shape is its bucket: the packed rows
(ConversationPacker's row buckets, data.packing.length tokens each) and the labelled positions the LM head
runs at (its label buckets), calibrated from the data so that most batches take the smallest and any batch
has one. Here each bucket is forced in turn (the packer offered that bucket and the largest, for a batch
that does not fit): its first step pays the compilation, `--repeats` more give its step time. Peak RSS is
the process's high-water mark (VmHWM) after that bucket's first step, so it grows as graphs accumulate
(MindSpore keeps each graph's memory for the process's life); the whole run's peak is the last. Last, the
batches of one epoch are counted per bucket (packed from the conversations' sizes, no step): the graphs a
whole training run meets, and so its memory.
"""
import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path


def vm_hwm_gb() -> float:
    """This process's peak resident memory so far (/proc/self/status VmHWM), GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def measure(config: str, overrides, repeats: int, limit: int) -> dict:
    """Build `config`'s Trainer, then for every (rows, labels) bucket of its packer run its TrainStep on the
    stream's batches packed into that bucket: its first call (compilation) and `repeats` more."""
    import mindspore.dataset as ds

    from mindvl.config import load_config
    from mindvl.train import Trainer, TrainingArguments, create_model

    ds.config.set_prefetch_size(1)  # few batches packed ahead with the previous bucket
    with tempfile.TemporaryDirectory(prefix="vlm_buckets_") as out:  # the run's checkpoints, never kept
        # more steps than any bucket loop takes: the optimizer's learning-rate table has one entry per step
        cfg = load_config(config, [*overrides, f"train.output_dir={out}", "train.eval_every=0",
                                   "train.grad_accumulation=1", "train.max_steps=100000"])
        start = time.perf_counter()
        trainer = Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))
        setup_s = time.perf_counter() - start
        stream, packer = trainer.stream, trainer.stream.packer
        ids, labels = stream.columns.index("ids"), stream.columns.index("labels")
        rows_all, labels_all = list(packer.row_buckets), list(packer.label_buckets)
        buckets = {}
        batches = iter(stream)
        trainer.train_step.set_train(True)
        for rows in rows_all:
            for count in labels_all:
                # the stage packs with the packer it was given: from here on a batch takes this bucket, or the
                # largest when it does not fit (a few batches already packed ahead keep the earlier buckets)
                packer.row_buckets = sorted({rows, rows_all[-1]})
                packer.label_buckets = sorted({count, labels_all[-1]})
                for _ in range(limit):
                    if len(buckets.get((rows, count), {}).get("steps_s", ())) >= repeats:
                        break
                    _, batch = next(batches)
                    key = (int(batch[ids].shape[0]), int(batch[labels].shape[0]))
                    begin = time.perf_counter()
                    trainer.train_step(True, *batch)[0].asnumpy()
                    seconds = time.perf_counter() - begin
                    if key in buckets:
                        buckets[key]["steps_s"].append(seconds)
                    else:
                        buckets[key] = {"first_s": seconds, "steps_s": [], "peak_rss_gb": vm_hwm_gb()}
        batches.close()
        packer.row_buckets, packer.label_buckets = rows_all, labels_all
        return {"config": config, "setup_s": round(setup_s, 1), "token_cache_s": trainer.token_cache_seconds,
                "micro_batch": stream.micro_batch_size, "length": packer.length, "row_buckets": rows_all,
                "label_buckets": labels_all, "epoch_hits": epoch_hits(cfg, stream),
                "buckets": {f"{r}x{n}": value for (r, n), value in sorted(buckets.items())},
                "peak_rss_gb": round(vm_hwm_gb(), 2)}


def epoch_hits(cfg, stream) -> dict:
    """How many batches of one epoch (a shuffle of the stream's conversations, packed as training packs
    them) take each bucket: the graphs, and so the memory, a whole run meets."""
    import numpy as np

    sizes, packer, batch = stream.sizes, stream.packer, stream.micro_batch_size
    order = np.random.default_rng(cfg.data.seed).permutation(stream.rows)
    draws = (order[i:i + batch] for i in range(0, len(order) - batch + 1, batch))
    hits = Counter(packer.bucket(sizes.tokens[rows].tolist(), int(sizes.labels[rows].sum())) for rows in draws)
    return {f"{r}x{n}": count for (r, n), count in sorted(hits.items())}


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
    hits = ", ".join(f"{name} {count}" for name, count in report["epoch_hits"].items())
    lines.append(f"one epoch's batches per bucket: {hits}")
    lines.append(f"not reached (the data's batches do not fit them): {', '.join(unmet) or 'none'}; the whole run's "
                 f"peak RSS {report['peak_rss_gb']} GB")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="vlm-tiny")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=4, help="timed steps per bucket after its first")
    parser.add_argument("--limit", type=int, default=12, help="batches drawn at most to reach a bucket")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args(argv)
    from mindvl.cells.kernels.machine import describe

    print(f"machine: {describe(os.environ.get('MINDVL_KERNEL_ARCH', 'native'))}", flush=True)
    report = measure(args.config, args.overrides, args.repeats, args.limit)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
