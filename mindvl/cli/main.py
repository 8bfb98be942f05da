"""The `mindvl` command line: it only wires the library's entry points together."""
import argparse
import importlib
import os
import sys
from typing import List, Optional

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the progress bars

from mindvl.config import ConfigError  # noqa: E402

# the modules of mindvl/cli that register commands, in the order `mindvl --help` lists them; each imports the
# library only inside its handlers, so building the parser imports no MindSpore
COMMAND_GROUPS = ("data", "train", "eval", "export", "average", "lora", "convert", "generate", "quickstart", "serving",
                  "lite", "plan", "kernels", "plot")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindvl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        importlib.import_module(f"mindvl.cli.{group}").register(commands)
    return parser


def _user_errors() -> tuple:
    """The exceptions whose message tells the user what to fix; imported only once one is raised (some of
    their modules import MindSpore, which `mindvl query` never needs)."""
    from mindvl.data.root import DataRootError
    from mindvl.lite.model import LiteError
    from mindvl.model_package import PackageError
    from mindvl.preprocess import InputError
    from mindvl.pretrained import ConversionError
    from mindvl.runs import CheckpointError
    from mindvl.serving.client import ServingError
    from mindvl.serving.register import ServableError
    return ConfigError, InputError, CheckpointError, DataRootError, ConversionError, PackageError, ServingError, \
        ServableError, LiteError


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        print(f"mindvl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
