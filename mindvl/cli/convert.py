"""`mindvl convert`: published pretrained weights into a mindvl encoder."""
import argparse
import json


def _convert(args) -> None:
    from mindvl.pretrained import convert
    out = convert(args.source, args.out or f"pretrained/{args.source}", args.file)
    config = json.loads((out / "config.json").read_text())
    print(f"{args.source}: {config['parameters']:,} parameters ({config['kind']} encoder) -> {out}")


def register(commands: argparse._SubParsersAction) -> None:
    from mindvl.pretrained import SOURCES  # its choices and description (no MindSpore)
    convert = commands.add_parser("convert", help="convert published pretrained weights into a mindvl encoder",
                                  description="sources: " + "; ".join(f"{k}: {text}" for k, (_, text) in SOURCES.items()))
    convert.add_argument("source", choices=sorted(SOURCES))
    convert.add_argument("--out", help="folder to write (default: pretrained/<source>)")
    convert.add_argument("--file", help="the published file (default: the one in the installed wheel)")
    convert.set_defaults(func=_convert)
