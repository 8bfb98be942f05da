"""Data-path benchmark (issue 3): loader throughput next to the train step's appetite, and packing vs padding.

    python benchmarks/data_pipeline.py [--config tiny] [--data-root mindvl_data] [--steps 20]

Builds the data root if it is missing. Prints two tables:
  1. loader samples/s with 1 and 2 worker threads per stage (augmentation on, packing on), next to the
     samples/s the compiled train step consumes;
  2. the same model trained on the same batches (same seed, same samples, same order) with every stream
     padded to the longest possible sample vs packed into row buckets (text: questions and captions;
     audio: clips; fusion: the fused sequences; mindvl/data/reading/packing.py): each stream's rows and fill
     ratio, step time and useful (non-padding) tokens per second, counted over every Transformer input
     (vision, question, caption, audio, fusion). Both modes process exactly the same useful tokens per
     batch, so the useful-token rate ratio is the speed-up packing buys. Graph compilations: one per
     distinct (text, audio, fusion) shape combination met, each timed.
The loader is kept out of the step timing: batches are read first, then the steps run, in rounds of one
pass per mode. Step times are the median pass; the speed-up is the median over rounds of the padded
pass's time over the packed pass's (same useful tokens), with its range, because a shared machine's
speed drifts by 10-20% between passes and a round's two passes see nearly the same machine.
"""
import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")

from mindvl.data.reading.packing import stream_segments  # noqa: E402


def loader_rate(cfg, batches: int) -> float:
    from mindvl.data.reading.stream import TrainStream

    stream = iter(TrainStream(cfg))
    next(stream)  # pipeline start-up and table loading are not throughput
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    seconds = time.perf_counter() - start
    stream.close()
    return batches * cfg.data.batch_size / seconds


def useful_tokens(cfg, columns) -> int:
    """Non-padding tokens in one batch over every Transformer input; equal in both packing modes."""
    image_tokens = (cfg.preprocess.image_size // cfg.model.vision.patch_size) ** 2 + 1
    batch = columns["image"].shape[0]
    return int(batch * image_tokens + sum((s > 0).sum() for s in stream_segments(columns).values()))


def prepare(cfg, steps: int) -> dict:
    """A compiled trainer for `cfg` and `steps` batches read in advance, with their stream statistics."""
    from mindvl.train import Trainer, TrainingArguments, create_model

    trainer = Trainer(create_model(cfg), TrainingArguments(cfg, progress=False))
    trainer.train_step.set_train(True)
    batches = []
    stream = iter(trainer.stream)
    for _, batch in stream:
        batches.append(batch)
        if len(batches) == steps:
            break
    stream.close()  # stop the pipeline's prefetching: it would compete with the timed steps
    numpy_columns = [dict(zip(trainer.stream.columns, (t.asnumpy() for t in b))) for b in batches]
    segments = [stream_segments(c) for c in numpy_columns]
    streams = list(segments[0])  # the classifier's packed streams
    combos = [tuple(s[name].shape for name in streams) for s in segments]
    compile_seconds = []
    for combo in dict.fromkeys(combos):  # compile every shape combination before timing
        start = time.perf_counter()
        loss = trainer.train_step(True, *batches[combos.index(combo)])[0]
        loss.asnumpy()
        compile_seconds.append(time.perf_counter() - start)
    return {"step": trainer.train_step, "batches": batches, "batch_size": cfg.data.batch_size,
            "shapes": {name: sorted({s[name].shape for s in segments}) for name in streams},
            "fill": {name: np.mean([(s[name] > 0).mean() for s in segments]) for name in streams},
            "useful": np.mean([useful_tokens(cfg, c) for c in numpy_columns]),
            "compiles": len(compile_seconds), "compile_s": sum(compile_seconds), "seconds": []}


def time_pass(mode: dict) -> None:
    """One timed pass of train steps over the mode's batches; appends seconds per step."""
    start = time.perf_counter()
    for batch in mode["batches"]:
        loss, _ = mode["step"](*batch)
    loss.asnumpy()
    mode["seconds"].append((time.perf_counter() - start) / len(mode["batches"]))


def rates(mode: dict) -> dict:
    seconds = float(np.median(mode["seconds"]))
    return {"ms": seconds * 1000, "samples": mode["batch_size"] / seconds, "tokens": mode["useful"] / seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--data-root", default="mindvl_data")
    parser.add_argument("--steps", type=int, default=10, help="train steps per timed pass")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds of one timed pass per mode (medians are reported)")
    parser.add_argument("--loader-batches", type=int, default=30)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for both modes, e.g. --set data.packing.audio_frames=192")
    parser.add_argument("--out", default="/tmp/mindvl_bench_run", help="scratch run folder")
    args = parser.parse_args(argv)

    from mindvl.config import load_config
    from mindvl.data.build.builder import build_dataset

    base = [f"data.root={args.data_root}", f"train.output_dir={args.out}", *args.overrides]
    cfg = load_config(args.config, base)
    build_dataset(cfg, progress=False)
    print(f"mindvl data-path benchmark: recipe {args.config}, batch {cfg.data.batch_size}, "
          f"{os.cpu_count()} CPU cores\n")

    modes = {name: prepare(load_config(args.config, base + [f"data.packing.enabled={flag}"]), args.steps)
             for name, flag in (("padding", "false"), ("packing", "true"))}
    for _ in range(args.rounds):  # alternate, so drift in the machine's speed hits both modes alike
        for mode in modes.values():
            time_pass(mode)
    padded, packed = ({**mode, **rates(mode)} for mode in modes.values())
    round_speedups = np.array(padded["seconds"]) / np.array(packed["seconds"])  # equal useful tokens per step
    padded["speedup"], packed["speedup"] = 1.0, float(np.median(round_speedups))

    print("1. loader vs train step (samples/s)")
    print(f"   {'':28s} {'samples/s':>10s}")
    for workers in (1, 2):
        rate = loader_rate(load_config(args.config, base + [f"data.num_workers={workers}"]), args.loader_batches)
        print(f"   loader, {workers} worker(s) per stage {rate:10.0f}")
    print(f"   train step consumes (packed) {packed['samples']:10.0f}\n")

    print("2. packing vs padding (same model, same batches; rows x tokens per row, fill = useful / row slots)")
    names = list(packed["shapes"])
    header = "   mode    " + "".join(f"{name + ' rows x len':>18s} {'fill':>6s}" for name in names)
    print(header + f" {'ms/step':>8s} {'samples/s':>9s} {'useful tok/s':>12s} {'speed-up':>8s}")
    for mode, result in (("padding", padded), ("packing", packed)):
        line = f"   {mode:8s}"
        for name in names:
            line += f"{', '.join(f'{r}x{s}' for r, s in result['shapes'][name]):>18s} {result['fill'][name]:6.1%}"
        print(line + f" {result['ms']:8.0f} {result['samples']:9.1f} {result['tokens']:12.0f} "
                     f"{result['speedup']:7.2f}x")
    print(f"\n   speed-up per round (padded pass / packed pass): median {packed['speedup']:.2f}x, range "
          f"{round_speedups.min():.2f}-{round_speedups.max():.2f}x over {len(round_speedups)} rounds of {args.steps} steps")
    print(f"   useful tokens per batch: packing {packed['useful']:.0f}, padding {padded['useful']:.0f} "
          f"(the same batches: equal by construction)")
    for mode, result in (("padding", padded), ("packing", packed)):
        print(f"   compile, {mode}: {result['compiles']} graph(s), {result['compile_s']:.1f} s "
              f"(once per shape combination met)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
