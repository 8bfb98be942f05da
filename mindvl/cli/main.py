"""The `mindvl` command line: it only wires the library's entry points together."""
import argparse
import importlib
import sys
from typing import List, Optional

from mindvl.errors import MindvlError  # importing mindvl quiets MindSpore's C++ warnings first (mindvl/__init__.py)

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


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except MindvlError as exc:  # a message that names the fix; anything else is a bug and keeps its traceback
        print(f"mindvl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
