"""`mindvl quickstart`: build data, train, evaluate, export and verify in one folder (a generative recipe:
build data, train its stages, evaluate and answer)."""
import argparse

from mindvl.cli.options import add_config_args


def _quickstart(args) -> None:
    from mindvl.quickstart import run_quickstart
    run_quickstart(args.workdir, args.config, args.overrides, max_steps=args.max_steps)


def register(commands: argparse._SubParsersAction) -> None:
    quick = commands.add_parser("quickstart", help="build data, train, evaluate, export and verify")
    add_config_args(quick)
    quick.add_argument("--workdir", default="mindvl_quickstart", help="folder for data, run and export")
    quick.add_argument("--max-steps", type=int, default=None, metavar="N",
                       help="training steps (of each stage, for a generative recipe); default (or 0): the "
                            "recipe's own")
    quick.set_defaults(func=_quickstart)
