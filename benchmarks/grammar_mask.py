"""What structured output costs per token: the grammar's mask (engine.grammar, llguidance) beside the host
sampler's own work on the same logits, for each kind of grammar the server takes.

For a tokenizer.json (a converted LLM's; default the tiny Qwen2.5-VL reference of the tests, 368 tokens; pass a
converted Gemma 3 folder's for its 262,144), one run builds the library's view of the vocabulary once (timed),
then walks each grammar as a sequence would: per step the mask is computed and applied to random logits, a token
is drawn greedily among the allowed ones and consumed, until the grammar completes or 64 steps. It prints the
mask's median and p99 per token beside the sampler's step without a grammar (greedy choice + the chosen token's
log-probability over the same logits), and the machine it ran on.

    python benchmarks/grammar_mask.py [--tokenizer PATH/tokenizer.json] [--steps 64] [--json OUT]
"""
import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
                                           "count": {"type": "integer"},
                                           "shape": {"type": "string", "enum": ["circle", "square", "triangle"]}},
          "required": ["answer", "count", "shape"], "additionalProperties": False}


def walk(grammars, grammar, width: int, steps: int, rng) -> dict:
    """Mask + sample timings over one sequence under `grammar`."""
    from mindvl.engine.sampling import SamplingConfig, next_tokens, token_logprobs

    constraint = grammars.constraint(grammar)
    masked, plain = [], []
    settings = SamplingConfig()
    for _ in range(steps):
        logits = rng.standard_normal((1, width)).astype(np.float32)
        start = time.perf_counter()
        token = next_tokens(logits, settings, rng)
        token_logprobs(logits, token)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        allowed = constraint.allowed(width)
        choosable = np.where(allowed[None], logits, -np.inf)
        masked.append(time.perf_counter() - start)
        token = int(next_tokens(choosable, settings, rng)[0])
        constraint.consume(token)
        if constraint.matcher.is_stopped():
            break
    return {"tokens": len(masked), "mask_ms_median": 1e3 * float(np.median(masked)),
            "mask_ms_p99": 1e3 * float(np.percentile(masked, 99)), "sampler_ms_median": 1e3 * float(np.median(plain))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "tests" / "references" / "tiny_qwen2_5_vl" / "tokenizer.json"
    parser.add_argument("--tokenizer", default=str(default))
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind
    from mindvl.engine.grammar import Grammar, Grammars

    print(f"machine: {cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores")
    tokenizer = Tokenizer.from_file(args.tokenizer)
    stops = [t for t in (tokenizer.token_to_id(s) for s in ("<end_of_turn>", "<|im_end|>", "<eos>")) if t is not None]
    start = time.perf_counter()
    grammars = Grammars(tokenizer, stops)
    build = time.perf_counter() - start
    width = grammars.vocab_size
    print(f"tokenizer: {args.tokenizer} ({width:,} tokens); the grammar library's view of it built in {build:.2f} s")
    rng = np.random.default_rng(0)
    rows = {}
    for name, grammar in [("json_schema", Grammar("json_schema", SCHEMA)), ("json_object", Grammar("json_object")),
                          ("regex", Grammar("regex", "[0-9]{3}-[a-z]{2,8}( [a-z]+)*")),
                          ("choice", Grammar("choice", ["circle", "square", "triangle", "none of them"]))]:
        rows[name] = walk(grammars, grammar, width, args.steps, rng)
    print(f"{'grammar':<12} {'tokens':>6} {'mask ms (median)':>17} {'mask ms (p99)':>14} {'sampler ms, no grammar':>23}")
    for name, row in rows.items():
        print(f"{name:<12} {row['tokens']:>6} {row['mask_ms_median']:>17.3f} {row['mask_ms_p99']:>14.3f} "
              f"{row['sampler_ms_median']:>23.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"build_s": build, "vocab": width, "grammars": rows}, indent=1))


if __name__ == "__main__":
    main()
