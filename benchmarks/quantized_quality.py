"""What weight-only quantization costs Gemma 3 270M in quality (issue 51): each converted folder (float32, int8,
int4, and the GGUF's own blocks) against the float32 one on the same text, per folder

    perplexity      exp(mean negative log-likelihood) of every next token over windows of the text (full forward
                    passes: the products' float32 activations, so this is the weights' rounding alone)
    top-1 agreement the share of those positions whose most likely next token is float32's
    greedy          free-running greedy generation from prompts cut from the text (the decode graph: the steps'
                    activations rounded to int8 per 32 too): the share of tokens equal to float32's up to the first
                    difference, and the prompts whose whole answer is float32's

The text: the licence texts every Debian system holds (/usr/share/common-licenses: GPL-3, Apache-2.0, MPL-2.0;
~17,000 Gemma tokens). Not held out from Gemma's pretraining (licences are on the web), but the same text for every
folder, which is what a comparison needs; no calibration data is read by any of the layouts.

    python benchmarks/quantized_quality.py [--folders float32=DIR int8=DIR ...] [--window 512] [--windows 16]
                                           [--prompts 16] [--new-tokens 32] [--json OUT]

Without --folders it converts the installed GGUF (weights.txt) four times into --work (default
~/.cache/mindvl/quality): ~2 minutes, 2 GB of disk.
"""
import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

TEXTS = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
         "/usr/share/common-licenses/MPL-2.0")
LAYOUTS = ("float32", "int8", "int4", "gguf")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def folders(args) -> dict:
    if args.folders:
        return dict(item.split("=", 1) for item in args.folders)
    from mindvl.pretrained.llm import convert_gguf

    work = Path(args.work).expanduser()
    found = {}
    for layout in LAYOUTS:
        folder = work / f"gemma3-{layout}"
        if not (folder / "config.json").is_file():
            convert_gguf(None, folder, log=lambda *_: None, weights=layout)
        found[layout] = str(folder)
    return found


def measure(folder: str, windows, prompts, new_tokens: int, reference=None) -> dict:
    from mindvl.generation.language_model import LanguageModel

    model = LanguageModel(folder, cache_len=max(len(w) for w in windows) + 8)
    started = time.perf_counter()
    nll, best = [], []
    for window in windows:
        logits = model.logits(window)[:-1]
        nll.append(-log_softmax(logits)[np.arange(len(window) - 1), window[1:]])
        best.append(logits.argmax(axis=-1))
    answers = [model.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True).tokens for prompt in prompts]
    row = {"weights": model.weights, "perplexity": float(np.exp(np.concatenate(nll).mean())),
           "seconds": time.perf_counter() - started, "best": best, "answers": answers}
    if reference is not None:
        same = np.concatenate([a == b for a, b in zip(best, reference["best"])])
        row["top1_agreement"] = float(same.mean())
        prefix = [next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(theirs))
                  for mine, theirs in zip(answers, reference["answers"])]
        row["greedy_prefix_share"] = float(np.mean(prefix) / new_tokens)
        row["greedy_identical"] = f"{sum(p == new_tokens for p in prefix)}/{len(prompts)}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", nargs="*", metavar="NAME=DIR", help="converted LLM folders, the first the reference")
    parser.add_argument("--work", default=os.path.join("~", ".cache", "mindvl", "quality"))
    parser.add_argument("--window", type=int, default=512, help="tokens per perplexity window")
    parser.add_argument("--windows", type=int, default=16, help="windows read (at most what the text holds)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from mindvl.cells.kernels.machine import describe

    chosen = folders(args)
    tokenizer = Tokenizer.from_file(str(Path(next(iter(chosen.values()))) / "tokenizer.json"))
    bos = tokenizer.encode("").ids  # the BOS a prompt starts with (Gemma reads nothing well without it)
    ids = [i for path in TEXTS for i in tokenizer.encode(Path(path).read_text(), add_special_tokens=False).ids]
    size = args.window - len(bos)
    windows = [bos + ids[i:i + size] for i in range(0, len(ids) - size + 1, size)][:args.windows]
    step = len(ids) // args.prompts
    prompts = [bos + ids[i * step:i * step + 24] for i in range(args.prompts)]  # 24 tokens of the text each
    print(f"machine: {describe('native')}")
    print(f"text: {len(ids):,} tokens of {', '.join(Path(t).name for t in TEXTS)}; {len(windows)} windows of "
          f"{args.window}; {len(prompts)} prompts of 24 tokens, {args.new_tokens} greedy tokens each")
    rows, reference = {}, None
    print(f"{'folder':<10} {'weights':<8} {'perplexity':>10} {'top-1 agree':>11} {'greedy prefix':>13} "
          f"{'identical':>9} {'seconds':>8}")
    for name, folder in chosen.items():
        row = measure(folder, windows, prompts, args.new_tokens, reference)
        reference = reference or row
        rows[name] = {k: v for k, v in row.items() if k not in ("best", "answers")}
        print(f"{name:<10} {row['weights']:<8} {row['perplexity']:>10.3f} {row.get('top1_agreement', 1.0):>11.1%} "
              f"{row.get('greedy_prefix_share', 1.0):>13.1%} {row.get('greedy_identical', '-'):>9} "
              f"{row['seconds']:>8.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
