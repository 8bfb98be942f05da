"""`mindvl quickstart`: build data, train, evaluate, export and verify in one folder."""
import argparse

from mindvl.cli.options import add_config_args


def _quickstart(args) -> None:
    from mindvl.quickstart import run_quickstart
    run_quickstart(args.workdir, args.config, args.overrides)


def register(commands: argparse._SubParsersAction) -> None:
    quick = commands.add_parser("quickstart", help="build data, train, evaluate, export and verify")
    add_config_args(quick)
    quick.add_argument("--workdir", default="mindvl_quickstart", help="folder for data, run and export")
    quick.set_defaults(func=_quickstart)
