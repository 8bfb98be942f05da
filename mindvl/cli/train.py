"""`mindvl train`: train a recipe."""
import argparse
import json
import os
from dataclasses import asdict

from mindvl.cli.options import add_config_args
from mindvl.config import load_config


def _train(args) -> None:
    from mindvl.train import train
    result = train(load_config(args.config, args.overrides), resume=args.resume)
    if os.environ.get("RANK_ID", "0") == "0":  # under msrun every rank holds the same result
        print(json.dumps(asdict(result), indent=2) if args.json else result.summary())


def register(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a recipe")
    add_config_args(train)
    train.add_argument("--resume", metavar="CKPT|RUN|auto",
                       help="continue from a checkpoint (step_* folder), a run's latest one, or 'auto': the "
                            "latest in train.output_dir if any (same samples as an uninterrupted run)")
    train.add_argument("--json", action="store_true", help="print the whole result as JSON instead of the summary")
    train.set_defaults(func=_train)
