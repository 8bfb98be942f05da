"""`mindvl data build`: clean a source into MindRecord shards."""
import argparse
import json
from dataclasses import asdict

from mindvl.cli.options import add_config_args
from mindvl.config import load_config


def _data_build(args) -> None:
    from mindvl.data.build.builder import build_dataset
    cfg = load_config(args.config, args.overrides)
    # paths are set on the config, not through --set, so that YAML never reinterprets them
    for value, section, key in ((args.root, cfg.data, "root"), (args.from_folder, cfg.data, "source"),
                                (args.shards, cfg.data, "shards"),
                                (args.align_checkpoint, cfg.data.cleaning, "align_checkpoint"),
                                (args.align_min_similarity, cfg.data.cleaning, "align_min_similarity")):
        if value is not None:
            setattr(section, key, value)
    cfg.validate()
    scorer = None
    if cfg.data.cleaning.align_checkpoint:  # the data layer loads no model: the scorer is handed over
        from mindvl.eval.alignment import AlignmentScorer
        scorer = AlignmentScorer(cfg.data.cleaning.align_checkpoint)
    report = build_dataset(cfg, limit=args.limit, force=args.force, scorer=scorer)
    print(json.dumps(asdict(report), indent=2, default=str) if args.json else report.summary())


def register(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="data set commands").add_subparsers(dest="data_command", required=True)
    build = data.add_parser("build", help="clean a source (easy-VQA or your folder) into MindRecord shards")
    add_config_args(build)
    build.add_argument("--root", help="output folder (default: data.root of the config)")
    build.add_argument("--from-folder", metavar="DIR", help="build from your own data instead of easy-VQA: DIR holds "
                       "train.jsonl, test.jsonl and the files they name (data.source; see mindvl/data/build/userdata.py)")
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
