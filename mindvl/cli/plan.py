"""`mindvl plan`: per-rank memory, communication and step time of a parallel strategy (mindvl.parallel.planner),
or with --search the valid strategies for a device count ranked by predicted step time under a memory cap."""
import argparse
import json
import sys

from mindvl.cli.options import add_config_args
from mindvl.config import load_config
from mindvl.errors import ConfigError
from mindvl.parallel.hardware import Hardware

GB = 1e9


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", help="predict memory, communication and step time of a parallel strategy")
    add_config_args(parser, example="data.batch_size=512")
    parser.add_argument("--strategy", help="strategy name (parallel_configs/) or YAML path; not needed with --search")
    parser.add_argument("--devices", type=int, help="device count (default: the strategy's dp x mp x pp)")
    parser.add_argument("--search", action="store_true", help="rank every valid strategy for --devices")
    parser.add_argument("--top", type=int, default=10, help="strategies listed by --search")
    parser.add_argument("--memory-cap-gb", type=float, help="per-rank memory cap (default: the device's memory)")
    defaults = Hardware()
    parser.add_argument("--device-tflops", type=float, default=defaults.peak_tflops, help="peak TFLOP/s per device")
    parser.add_argument("--efficiency", type=float, default=defaults.efficiency, help="achieved fraction of peak")
    parser.add_argument("--device-memory-gb", type=float, default=defaults.memory_gb)
    parser.add_argument("--link-gbps", type=float, default=defaults.intra_node_gbps,
                        help="intra-node bandwidth per device, GB/s")
    parser.add_argument("--inter-node-gbps", type=float, default=defaults.inter_node_gbps,
                        help="inter-node bandwidth per device, GB/s")
    parser.add_argument("--devices-per-node", type=int, default=defaults.devices_per_node)
    parser.add_argument("--activation-overhead", type=float, default=defaults.activation_overhead,
                        help="bytes the backend keeps per byte of the activation accounting (1: Ascend; ~4.4: "
                             "MindSpore's CPU executor, benchmarks/activation_memory.py)")
    parser.add_argument("--json", action="store_true", help="print the plan (or the ranking) as JSON")
    parser.add_argument("--plot", metavar="STEM", help="also draw per-device memory by kind against the cap into "
                        "STEM.png and STEM.svg: the strategy, or with --search the ranked ones and those faster "
                        "that the cap rejected")
    parser.add_argument("--dump-strategy", action="store_true",
                        help="print the per-primitive shard strategies the strategy sets (JSON)")
    parser.add_argument("--dryrun", metavar="DIR", help="compile the strategy per pipeline stage with MindSpore's "
                        "dry run (msrun --sim_level 1; needs an Ascend build of MindSpore and the built data set), "
                        "logs under DIR, and print each rank's simulated peak memory")
    parser.set_defaults(func=plan_command)


def hardware_from_args(args) -> Hardware:
    return Hardware(peak_tflops=args.device_tflops, efficiency=args.efficiency, memory_gb=args.device_memory_gb,
                    intra_node_gbps=args.link_gbps, inter_node_gbps=args.inter_node_gbps,
                    devices_per_node=args.devices_per_node, activation_overhead=args.activation_overhead)


def _plot(args, pairs, cap: float, title: str) -> None:
    from mindvl.plots.figure import written
    from mindvl.plots.plan import plot_memory

    strategies = [{"name": strategy.name, "plan": result.to_dict()} for strategy, result in pairs]
    label = "--memory-cap-gb" if args.memory_cap_gb is not None else "the device's memory"
    # beside --json's document, not inside it
    print(written(list(plot_memory(strategies, cap, args.plot, label, title))), file=sys.stderr if args.json else None)


def _search(args, cfg, hardware: Hardware, cap: float) -> int:
    from mindvl.parallel.planner import rank

    every = rank(cfg, args.devices, hardware)
    ranked = [pair for pair in every if pair[1].total_bytes <= cap]  # planner.search
    if args.json:
        print(json.dumps([{"strategy": s.to_dict(), "plan": p.to_dict()} for s, p in ranked[:args.top]], indent=2))
    elif not ranked:
        print(f"no valid strategy for {args.devices} devices fits {cap / GB:g} GB")
    else:
        print(f"{'strategy':34} {'memory GB':>9} {'step s':>10} {'samples/s':>11} {'bubble':>7}")
        for strategy, p in ranked[:args.top]:
            print(f"{strategy.name:34} {p.total_bytes / GB:9.2f} {p.step_time_s:10.4g} {p.samples_per_s:11.1f} "
                  f"{p.bubble_fraction:7.1%}")
    if args.plot:  # the listed strategies and the faster ones the cap rejected, fastest first
        fastest = ranked[0][1].step_time_s if ranked else float("inf")
        rejected = [pair for pair in every if pair[1].total_bytes > cap and pair[1].step_time_s < fastest]
        shown = sorted(ranked[:args.top] + rejected[:args.top], key=lambda pair: (pair[1].step_time_s,
                                                                                 pair[1].total_bytes))
        _plot(args, shown, cap, f"{cfg.name}: {args.devices} devices, the {min(len(ranked), args.top)} fastest that "
                                f"fit and {len(rejected[:args.top])} faster over the cap")
    return 0 if ranked or args.json else 1


def plan_command(args) -> int:
    from mindvl.parallel.planner import memory_cap_bytes, plan
    from mindvl.parallel.strategy import create_strategy

    cfg = load_config(args.config, args.overrides)
    hardware = hardware_from_args(args)
    cap = memory_cap_bytes(args.memory_cap_gb, hardware)
    if args.search:
        if not args.devices:
            raise ConfigError("--devices: --search needs the device count, e.g. --devices 64")
        return _search(args, cfg, hardware, cap)
    if not args.strategy:
        raise ConfigError("--strategy: name a strategy (parallel_configs/) or use --search --devices N")
    strategy = create_strategy(args.strategy)
    if args.dryrun:
        from pathlib import Path

        from mindvl.parallel.dryrun import run_dryrun
        results = run_dryrun(args.config, args.overrides, args.strategy, strategy, Path(args.dryrun))
        for rank, row in results.items():
            print(f"rank {rank}: {'compiled' if row['ok'] else 'FAILED'}, peak {row['used_peak_mb']} MB "
                  f"({row['actual_peak_mb']} MB with fragments); log {row['log']}")
        return 0 if all(row["ok"] for row in results.values()) else 1
    if args.dump_strategy:
        from mindvl.parallel.apply import dump_strategy
        print(json.dumps(dump_strategy(cfg, strategy), indent=2, default=str))
        return 0
    result = plan(cfg, strategy, hardware, args.devices)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render(strategy.name, result))
    if args.plot:
        _plot(args, [(strategy, result)], cap, f"{cfg.name}: strategy {strategy.name}, {result.devices} devices")
    return 0


def render(name: str, p) -> str:
    s = p.strategy
    recompute = "full" if s["recompute_config"]["recompute"] else \
        "select" if s["recompute_config"]["select_recompute"] else "off"
    lines = [
        f"strategy {name}: dp {s['data_parallel']} x mp {s['model_parallel']} x pp {s['pipeline_stage']} = "
        f"{p.devices} devices, {s['micro_batch_num']} micro-batches, parallel optimizer "
        f"{'on' if s['enable_parallel_optimizer'] else 'off'}, recompute {recompute}",
        f"model: {p.parameter_count:,} parameters ({p.trainable_parameter_count:,} trainable)",
        *([f"sample: one conversation of {p.sample_tokens} tokens, {p.sample_labels} of them labelled"
           + (" (a whole packed row: the data set or the decoder's tokenizer is not here, an upper bound)"
              if p.sample_tokens == p.sample_labels else " (means over the built data set's training conversations)")]
          if p.sample_tokens else []),
        "per rank (the most loaded stage):",
        f"  parameters            {p.parameter_bytes / GB:10.3f} GB",
        f"  gradients             {p.gradient_bytes / GB:10.3f} GB",
        f"  optimizer states      {p.optimizer_bytes / GB:10.3f} GB ({p.optimizer_bytes_unsharded / GB:.3f} GB unsharded)",
        f"  activations/micro     {p.activation_bytes_per_micro_batch / GB:10.3f} GB "
        f"({p.activation_bytes_per_micro_batch_no_recompute / GB:.3f} GB without recompute)",
        f"  in flight             {p.in_flight_micro_batches:10d} micro-batches",
        f"  total                 {p.total_bytes / GB:10.3f} GB of {p.hardware['memory_gb']:.0f} GB",
        "communication per step and rank:",
        f"  dp gradient all-reduce {p.comm_bytes['dp_grad_allreduce'] / GB:9.3f} GB ({p.comm_s['dp'] * 1e3:.2f} ms)",
        f"  tp reduce-scatter      {p.comm_bytes['tp_reduce_scatter'] / GB:9.3f} GB, all-gather "
        f"{p.comm_bytes['tp_all_gather'] / GB:.3f} GB ({p.comm_s['tp'] * 1e3:.2f} ms)",
        f"  pp send/receive        {p.comm_bytes['pp_send_recv'] / GB:9.3f} GB ({p.comm_s['pp'] * 1e3:.2f} ms)",
        f"step {p.step_time_s * 1e3:.2f} ms, {p.samples_per_s:,.1f} samples/s; pipeline bubble "
        f"{p.bubble_fraction:.1%}, slowest/mean stage {p.stage_imbalance:.2f}",
    ]
    for st in p.stages:
        lines.append(f"  stage {st['stage']}: {st['first_block']}..{st['last_block']} "
                     f"{st['memory_bytes'] / GB:.3f} GB, {st['time_s'] * 1e3:.3f} ms per micro-batch")
    return "\n".join(lines)

