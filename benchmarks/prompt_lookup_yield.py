"""What prompt-lookup speculation gives on text that does not quote its prompt: each text's tokens replayed as if a
model had generated them after its first `--prompt` tokens, drafts taken as the server takes them
(mindvl.engine.prompt_lookup, `--speculative-tokens`) and kept while they are the next tokens, each step costing
one decode call, or one 8-token call when it verifies drafts; that call's cost against a one-token call measured on
a package's own graphs (`decode`, `extend_8`) at batch 1. Prints, per text, the share of steps that verified
drafts, the tokens accepted and the expected decode speed against plain decoding (>= 1: never slower), verifying
every draft and as the engine decides (prompt_lookup.worth_verifying).

    python benchmarks/prompt_lookup_yield.py --package PKG [--prompt 200] [--tokens 2000] [--speculative-tokens 5]

Texts: Debian's licence texts and the Python standard library's documentation (pydoc), tokenised by the
package's tokenizer: real English prose and technical text that no model here has to produce.
"""
import argparse
import os
import pydoc
import time
from pathlib import Path

import numpy as np

LICENCES = Path("/usr/share/common-licenses")
MODULES = ("argparse", "collections", "json", "pathlib", "asyncio")


def step_costs(package: Path, repeats: int = 10):
    """(one-token call ms, 8-token call ms) of the package's graphs at batch 1, half the cache valid."""
    from mindvl.engine.package_graphs import GenerationSpec, PackageGraphs
    from mindvl.package_reader import graph_caller, load_graph, read_manifest

    manifest = read_manifest(package)
    spec = GenerationSpec.from_manifest(manifest)
    graphs = PackageGraphs(spec, graph_caller({name: load_graph(package, manifest, name)
                                               for name in spec.graph_names() if name.startswith(("decode", "extend"))}))
    caches = [np.zeros((1, spec.cache_len, spec.kv_width), np.float32) for _ in range(2 * spec.layers)]
    costs = []
    for steps in (1, spec.extend_steps):
        start = spec.cache_len // 2
        token = np.full((1, steps), 7, np.int32)
        slot = (start + np.arange(steps, dtype=np.int32))[None]
        valid = np.zeros((1, spec.cache_len), bool)
        valid[0, :start + steps] = True
        graphs.decode(token, slot, slot, valid, caches)
        begin = time.perf_counter()
        for _ in range(repeats):
            graphs.decode(token, slot, slot, valid, caches)
        costs.append((time.perf_counter() - begin) / repeats * 1000)
    return costs


def replay(ids, prompt: int, count: int, ratio: float, policy: bool):
    """(expected speed against plain decoding, share of steps that verified drafts, tokens accepted) of `ids`
    after its first `prompt` tokens; policy: verify only where the engine would (prompt_lookup.worth_verifying,
    its running mean of accepted tokens), else wherever there are drafts."""
    from mindvl.engine.prompt_lookup import FIRST_EXPECTED, drafts, expected_after, worth_verifying

    position, cost, steps, verified, accepted, expected = prompt, 0.0, 0, 0, 0, FIRST_EXPECTED
    while position < len(ids):
        guess = drafts(ids[:position], count)
        kept = 0
        while kept < len(guess) and position + kept < len(ids) and guess[kept] == ids[position + kept]:
            kept += 1
        if len(guess) and (not policy or worth_verifying(expected, 1, ratio)):
            cost, verified, accepted = cost + ratio, verified + 1, accepted + kept
            expected = expected_after(expected, kept)
            position += kept + 1
        else:
            cost += 1.0
            expected = expected_after(expected, float(kept > 0)) if len(guess) else expected
            position += 1
        steps += 1
    return (len(ids) - prompt) / cost, verified / steps, accepted


def main(argv=None) -> None:
    from tokenizers import Tokenizer

    from mindvl.cells.kernels.machine import machine_line
    from mindvl.package_reader import read_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="a generative package exported with extend_8")
    parser.add_argument("--prompt", type=int, default=200, help="tokens of each text taken as its prompt")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens of each text read")
    parser.add_argument("--speculative-tokens", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOG_v", "3")
    print(f"machine: {machine_line()}", flush=True)
    package = Path(args.package)
    one, several = step_costs(package)
    ratio = several / one
    print(f"{package.name}: a one-token call {one:.1f} ms, an 8-token call {several:.1f} ms ({ratio:.2f}x)")
    tokenizer = Tokenizer.from_file(str(package / read_manifest(package)["generation"]["tokenizer"]))
    texts = {f"licence {p.name}": p.read_text() for p in sorted(LICENCES.glob("*")) if p.stat().st_size > 20000}
    texts.update({f"pydoc {name}": pydoc.render_doc(__import__(name), renderer=pydoc.plaintext) for name in MODULES})
    print("| text | always: steps verified | tokens accepted | speed vs plain | engine's policy: steps verified | "
          "tokens accepted | speed vs plain |\n|---|---|---|---|---|---|---|")
    slowest = {False: 9.0, True: 9.0}
    for name, text in texts.items():
        ids = np.asarray(tokenizer.encode(" ".join(text.split())).ids[:args.tokens], np.int32)
        cells = []
        for policy in (False, True):
            speed, share, accepted = replay(ids, args.prompt, args.speculative_tokens, ratio, policy)
            slowest[policy] = min(slowest[policy], speed)
            cells.append(f"{share:.0%} | {accepted} of {len(ids) - args.prompt} | {speed:.2f}x")
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"\nslowest: {slowest[False]:.2f}x verifying every draft, {slowest[True]:.2f}x with the engine's policy "
          f"(goal: never below 0.95x)")

if __name__ == "__main__":
    main()
