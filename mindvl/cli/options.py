"""What more than one command group shares: the recipe arguments (--config/--set), the package key
arguments, and reading a file an argument names."""
import argparse
from pathlib import Path
from typing import Optional

from mindvl.errors import ConfigError


def add_config_args(parser: argparse.ArgumentParser, example: str = "train.lr=3e-4") -> None:
    """--config RECIPE (default tiny) and the repeatable --set KEY=VALUE (`args.overrides`)."""
    parser.add_argument("--config", default="tiny", help="recipe name (mindvl/configs) or YAML path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config key, e.g. --set {example} (repeatable)")


def add_key_args(parser: argparse.ArgumentParser, title: str = "encryption (AES-GCM; never a key on the command line)",
                 key_file_help: str = "file holding a 16/24/32-byte key, raw or as hex text") -> None:
    """--key-file PATH and --key-env VAR, in their own group of the help."""
    keys = parser.add_argument_group(title)
    keys.add_argument("--key-file", metavar="PATH", help=key_file_help)
    keys.add_argument("--key-env", metavar="VAR", help="environment variable holding the key as hex text")


def package_key(args) -> Optional[bytes]:
    """The key --key-file or --key-env names, or None."""
    from mindvl.package_reader import read_key
    return read_key(args.key_file, args.key_env)


def file_bytes(given: str, path: str) -> bytes:
    """The bytes of the file `path`; `given` is the argument that named it, for the error."""
    if not Path(path).is_file():
        raise ConfigError(f"{given}: no such file")
    return Path(path).read_bytes()
