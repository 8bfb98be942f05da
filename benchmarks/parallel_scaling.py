"""The scaling table of the README (issue 9): for the tiny recipe, pretrained-s, fusion-12b, llm-8b and mindvl-8b (the
seed's native-resolution VLM, issue 49) at 8, 64 and 1024
Ascend 910B devices, the fastest strategy `mindvl plan --search` finds under the memory cap, its per-rank memory,
predicted step time, scaling efficiency against 8 devices, and the best pure data-parallel strategy's
throughput (the "hybrid vs DP" ratio). Weak scaling: the global batch grows with the devices (PER_DEVICE
samples each), as the published 1024-card runs do. Predictions only (mindvl.parallel.planner), no device runs.

    python benchmarks/parallel_scaling.py [--memory-cap-gb 64] [--recipe NAME ...] [--json]
"""
import argparse
import json
import time

from mindvl.config import load_config
from mindvl.parallel.hardware import Hardware
from mindvl.parallel.planner import search

# recipe: samples (llm-8b, mindvl-8b: packed rows) per device
RECIPES = {"tiny": 8, "pretrained-s": 8, "fusion-12b": 2, "llm-8b": 2, "mindvl-8b": 2}
DEVICES = (8, 64, 1024)
GB = 1e9


def describe(strategy) -> str:
    s = strategy
    rc = "full" if s.recompute_config.recompute else "select" if s.recompute_config.select_recompute else "off"
    return (f"dp{s.data_parallel} mp{s.model_parallel} pp{s.pipeline_stage} m{s.micro_batch_num}"
            f"{' zero' if s.enable_parallel_optimizer else ''} rc:{rc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-cap-gb", type=float, default=64.0)
    parser.add_argument("--recipe", action="append", choices=sorted(RECIPES), help="only these (repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    hardware = Hardware()
    rows = []
    started = time.perf_counter()
    for recipe, per_device in RECIPES.items():
        if args.recipe and recipe not in args.recipe:
            continue
        base = None
        for devices in DEVICES:
            cfg = load_config(recipe, [f"data.batch_size={per_device * devices}"])
            ranked = search(cfg, devices, args.memory_cap_gb, hardware)
            dp_only = [pair for pair in ranked if pair[0].model_parallel == 1 and pair[0].pipeline_stage == 1]
            row = {"recipe": recipe, "devices": devices, "global_batch": per_device * devices}
            if ranked:
                best, p = ranked[0]
                per_device_rate = p.samples_per_s / devices
                base = base if base is not None else (per_device_rate if devices == DEVICES[0] else None)
                row.update(strategy=describe(best), memory_gb=p.total_bytes / GB, step_s=p.step_time_s,
                           samples_per_s=p.samples_per_s, bubble=p.bubble_fraction,
                           efficiency=per_device_rate / base if base else None)
            if dp_only:
                row["dp_samples_per_s"] = dp_only[0][1].samples_per_s
                row["dp_memory_gb"] = dp_only[0][1].total_bytes / GB
            row["hybrid_vs_dp"] = (row["samples_per_s"] / row["dp_samples_per_s"]
                                   if ranked and dp_only else None)
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"| recipe | devices | global batch | best strategy (search, <= {args.memory_cap_gb:.0f} GB) | memory/rank GB "
          f"| step s | samples/s | bubble | scaling eff. vs 8 | pure DP samples/s (GB) | hybrid / DP |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "strategy" not in r:
            print(f"| {r['recipe']} | {r['devices']} | {r['global_batch']} | none fits | | | | | | | |")
            continue
        dp = (f"{r['dp_samples_per_s']:,.0f} ({r['dp_memory_gb']:.1f})" if "dp_samples_per_s" in r
              else "does not fit")
        ratio = f"{r['hybrid_vs_dp']:.2f}x" if r["hybrid_vs_dp"] else "-"
        eff = f"{r['efficiency']:.0%}" if r["efficiency"] else "-"
        print(f"| {r['recipe']} | {r['devices']} | {r['global_batch']} | {r['strategy']} | {r['memory_gb']:.2f} | "
              f"{r['step_s']:.4g} | {r['samples_per_s']:,.0f} | {r['bubble']:.1%} | {eff} | {dp} | {ratio} |")
    print(f"\n(search time {time.perf_counter() - started:.1f} s; {hardware.name}: {hardware.peak_tflops:.0f} TFLOP/s "
          f"x {hardware.efficiency:.0%}, HCCS {hardware.intra_node_gbps:.0f} GB/s, RoCE {hardware.inter_node_gbps:.0f} "
          f"GB/s per card)")


if __name__ == "__main__":
    main()
