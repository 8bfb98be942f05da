"""The `mindvl` command line: it only wires the library's entry points together."""
import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import List, Optional

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the progress bars

from mindvl.config import ConfigError, load_config  # noqa: E402


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="tiny", help="recipe name (mindvl/configs) or YAML path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.lr=3e-4 (repeatable)")


def _data_build(args) -> None:
    from mindvl.data.build import build_dataset
    cfg = load_config(args.config, args.overrides)
    # paths are set on the config, not through --set, so that YAML never reinterprets them
    for value, section, key in ((args.root, cfg.data, "root"), (args.from_folder, cfg.data, "source"),
                                (args.shards, cfg.data, "shards"),
                                (args.align_checkpoint, cfg.data.cleaning, "align_checkpoint"),
                                (args.align_min_similarity, cfg.data.cleaning, "align_min_similarity")):
        if value is not None:
            setattr(section, key, value)
    cfg.validate()
    report = build_dataset(cfg, limit=args.limit, force=args.force)
    print(json.dumps(asdict(report), indent=2, default=str) if args.json else report.summary())


def _train(args) -> None:
    from mindvl.train import train
    result = train(load_config(args.config, args.overrides), resume=args.resume)
    if os.environ.get("RANK_ID", "0") == "0":  # under msrun every rank holds the same result
        print(json.dumps(asdict(result), indent=2) if args.json else result.summary())


def _eval(args) -> None:
    from mindvl.eval import evaluate, load_trained
    cfg, model = load_trained(args.run, args.data_root)
    print(json.dumps(evaluate(cfg, model), indent=2))


def _export(args) -> None:
    from mindvl.eval import load_trained
    from mindvl.export.mindir import export_and_verify
    cfg, model = load_trained(args.run, args.data_root)
    print(json.dumps(export_and_verify(cfg, model, args.out), indent=2))


def _average(args) -> None:
    from mindvl.train.average import average_checkpoints, evaluate_soup, format_report, read_record
    out = average_checkpoints(args.ingredients, args.weights, args.out)
    if not args.no_eval:
        evaluate_soup(out, args.data_root)
    print(format_report(read_record(out)))
    print(f"wrote {out} (mindvl eval --run {out})")


def _convert(args) -> None:
    from mindvl.pretrained import convert
    out = convert(args.source, args.out or f"pretrained/{args.source}", args.file)
    config = json.loads((out / "config.json").read_text())
    print(f"{args.source}: {config['parameters']:,} parameters ({config['kind']} encoder) -> {out}")


def _quickstart(args) -> None:
    from mindvl.quickstart import run_quickstart
    run_quickstart(args.workdir, args.config, args.overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindvl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="data set commands").add_subparsers(dest="data_command", required=True)
    build = data.add_parser("build", help="clean a source (easy-VQA or your folder) into MindRecord shards")
    _add_config_args(build)
    build.add_argument("--root", help="output folder (default: data.root of the config)")
    build.add_argument("--from-folder", metavar="DIR", help="build from your own data instead of easy-VQA: DIR holds "
                       "train.jsonl, test.jsonl and the files they name (data.source; see mindvl/data/userdata.py)")
    build.add_argument("--limit", type=int, help="at most N source images per split (0: all)")
    build.add_argument("--shards", type=int, help="MindRecord files per split (data.shards)")
    build.add_argument("--align-checkpoint", metavar="RUN", help="drop image-caption pairs a trained run scores "
                       "below --align-min-similarity (data.cleaning.align_checkpoint)")
    build.add_argument("--align-min-similarity", type=float, metavar="COS",
                       help="cosine similarity threshold (data.cleaning.align_min_similarity)")
    build.add_argument("--force", action="store_true", help="rebuild even if a complete build exists (and discard "
                       "an interrupted one instead of resuming it)")
    build.add_argument("--json", action="store_true", help="print the whole report as JSON instead of the table")
    build.set_defaults(func=_data_build)

    train = commands.add_parser("train", help="train a recipe")
    _add_config_args(train)
    train.add_argument("--resume", metavar="CKPT|RUN|auto",
                       help="continue from a checkpoint (step_* folder), a run's latest one, or 'auto': the "
                            "latest in train.output_dir if any (same samples as an uninterrupted run)")
    train.add_argument("--json", action="store_true", help="print the whole result as JSON instead of the summary")
    train.set_defaults(func=_train)

    for name, func, text in (("eval", _eval, "evaluate a trained run"),
                             ("export", _export, "export a trained run to MindIR and verify it")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--run", required=True, help="run folder, checkpoint folder or model.safetensors")
        sub.add_argument("--data-root", help="data set folder (default: the run's data.root)")
        if name == "export":
            sub.add_argument("--out", default="export/answer.mindir", help="MindIR file to write")
        sub.set_defaults(func=func)

    average = commands.add_parser("average", help="average checkpoints of one architecture (a model soup) and "
                                  "compare its VQA accuracy with each ingredient's")
    average.add_argument("ingredients", nargs="+", metavar="RUN_OR_CKPT",
                         help="run folder, checkpoint folder or model.safetensors (at least 2)")
    average.add_argument("--out", required=True, help="folder to write: config.json, model.safetensors, average.json")
    average.add_argument("--weights", nargs="+", type=float, metavar="W",
                         help="one weight >= 0 per ingredient, normalised to sum 1 (default: uniform)")
    average.add_argument("--data-root", help="data set to evaluate on (default: the first ingredient's data.root)")
    average.add_argument("--no-eval", action="store_true", help="only write the average")
    average.set_defaults(func=_average)

    from mindvl.pretrained import SOURCES
    convert = commands.add_parser("convert", help="convert published pretrained weights into a mindvl encoder",
                                  description="sources: " + "; ".join(f"{k}: {text}" for k, (_, text) in SOURCES.items()))
    convert.add_argument("source", choices=sorted(SOURCES))
    convert.add_argument("--out", help="folder to write (default: pretrained/<source>)")
    convert.add_argument("--file", help="the published file (default: the one in the installed wheel)")
    convert.set_defaults(func=_convert)

    quick = commands.add_parser("quickstart", help="build data, train, evaluate, export and verify")
    _add_config_args(quick)
    quick.add_argument("--workdir", default="mindvl_quickstart", help="folder for data, run and export")
    quick.set_defaults(func=_quickstart)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from mindvl.data.loader import DataRootError
    from mindvl.preprocess import InputError
    from mindvl.pretrained import ConversionError
    from mindvl.train.checkpoint import CheckpointError
    try:
        args.func(args)
    except (ConfigError, InputError, CheckpointError, DataRootError, ConversionError) as exc:
        print(f"mindvl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
