"""`mindvl plot PATH`: the pictures of what a command wrote, by what PATH holds (KINDS): a training run's curves,
a built data set's quarantine, lengths and packing, a calibrated package's cascade (accuracy and expected latency
against the cloud rate). PNG and SVG into PATH/plots (or --out)."""
import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

from mindvl.cli.options import add_config_args
from mindvl.config import load_config
from mindvl.errors import ConfigError


def _plot_run(path: Path, out: Path, args) -> List[Path]:
    from mindvl.plots.training import plot_training
    return plot_training(path, out)[1]


def _plot_data(path: Path, out: Path, args) -> List[Path]:
    from mindvl.data.reading.lengths import data_lengths
    from mindvl.plots.data import QUARANTINE_FILE, REPORT_FILE, plot_data

    cfg = load_config(args.config, args.overrides)
    cfg.data.root = str(path)  # a path on the config, never through --set (YAML would reinterpret it)
    quarantine = path / QUARANTINE_FILE
    lines = [json.loads(line) for line in quarantine.read_text().splitlines() if line.strip()] \
        if quarantine.is_file() else []
    return plot_data(json.loads((path / REPORT_FILE).read_text()), data_lengths(cfg), out, lines)[1]


def _plot_calibration(path: Path, out: Path, args) -> List[Path]:
    from mindvl.lite.calibration import load_calibration
    from mindvl.plots.cascade import plot_cascade
    return list(plot_cascade(load_calibration(path).to_dict(), out / "cascade"))


@dataclass(frozen=True)
class Kind:
    """What a folder holding `marker` is, and how it is drawn: plot(folder, out folder, args) -> files written."""

    name: str
    marker: str
    made_by: str  # the command that writes such a folder, for the error
    plot: Callable[[Path, Path, argparse.Namespace], List[Path]]


# In the order they are tried; another kind of result is one more entry.
KINDS = (Kind("a training run", "metrics.jsonl", "mindvl train", _plot_run),
         Kind("a built data set", "report.json", "mindvl data build", _plot_data),
         Kind("a calibrated package", "calibration.json", "mindvl lite calibrate", _plot_calibration))


def kind_of(path: Path) -> Kind:
    """The first of KINDS whose marker file `path` holds, else a ConfigError naming what was expected."""
    for kind in KINDS:
        if (path / kind.marker).is_file():
            return kind
    expected = " or ".join(f"{k.name} (a folder holding {k.marker}, as `{k.made_by}` writes it)" for k in KINDS)
    found = "does not exist" if not path.exists() else "is not a folder" if not path.is_dir() else \
        "holds none of " + ", ".join(k.marker for k in KINDS)
    raise ConfigError(f"mindvl plot {path}: it {found}; expected {expected}")


def _plot(args) -> None:
    from mindvl.plots.figure import written

    path = Path(args.path)
    kind = kind_of(path)
    print(written(kind.plot(path, Path(args.out) if args.out else path / "plots", args)))


def register(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser("plot", help="draw a training run's curves, a built data set's report or a "
                               "calibrated package's cascade (PNG and SVG)")
    plot.add_argument("path", metavar="PATH", help="a run folder (metrics.jsonl: loss per objective, learning rate, "
                      "gradient norms, samples/s, validation) or a data root (report.json: quarantine reasons, "
                      "sequence lengths, and the packing fill per bucket of the recipe --config names: a generative "
                      "recipe's conversation rows and labels), or a model package that `mindvl lite calibrate` "
                      "calibrated (calibration.json: the cascade's accuracy and latency against the cloud rate, the "
                      "threshold marked)")
    plot.add_argument("--out", metavar="DIR", help="folder for the pictures (default: PATH/plots)")
    add_config_args(plot, "data.batch_size=32")  # a data set's packing is the recipe's: its batch and buckets
    plot.set_defaults(func=_plot)
