"""A training run's curves from its metrics.jsonl: loss per objective, learning rate, gradient norm per module,
samples/s and the validation metrics, each against optimizer steps.

The panels follow what the records hold, not a recipe: a training record (mindvl/train/trainer.py) is the step,
the bookkeeping scalars in BOOKKEEPING, the dicts (grad_norm: module -> norm; loss_weight: objective -> learned
weight) and every other number is a loss (`loss`, the weighted total, and one per objective: contrastive, answer,
lm, ...); a record with "split" holds that split's evaluation at its step. A panel without data is left out.
"""
import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

from matplotlib.figure import Figure

from mindvl.plots.figure import new_figure, save_figure

METRICS_FILE = "metrics.jsonl"  # mindvl.runs.METRICS_FILE (the runs module imports MindSpore; plots do not)
BOOKKEEPING = ("lr", "samples_per_second", "loss_scale", "skipped_steps")
COLUMNS = 3  # at most; four panels go two by two
# panel title -> (y label, log scale)
PANELS = {"loss": ("loss", False), "learning rate": ("lr", False), "gradient norm": ("norm (log)", True),
          "samples/s": ("samples/s", False), "loss weights": ("weight", False), "validation": ("", False)}


def read_metrics(run: Union[str, Path]) -> List[Dict]:
    """The records of `run`/metrics.jsonl (or of that file itself), in order."""
    path = Path(run)
    path = path / METRICS_FILE if path.is_dir() else path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(records: Sequence[Dict], key: str, field: str = "") -> Tuple[List[int], List[float]]:
    points = [(r["step"], r[key][field] if field else r[key]) for r in records
              if key in r and (not field or field in r[key])]
    return [s for s, _ in points], [float(v) for _, v in points]


def training_panels(records: Sequence[Dict]) -> Dict[str, Dict[str, Tuple[List[int], List[float]]]]:
    """Panel title -> line label -> (steps, values), only panels with data, in PANELS order."""
    train = [r for r in records if "split" not in r and "step" in r]
    evals = [r for r in records if "split" in r and "step" in r]
    losses = [k for k in dict.fromkeys(k for r in train for k, v in r.items()
                                       if k != "step" and k not in BOOKKEEPING and isinstance(v, (int, float)))]
    losses.sort(key=lambda k: k != "loss")  # the total first, the objectives in the order logged

    def fields(key: str) -> List[str]:
        return list(dict.fromkeys(f for r in train if isinstance(r.get(key), dict) for f in r[key]))

    panels = {"loss": {k: _series(train, k) for k in losses},
              "learning rate": {"lr": _series(train, "lr")},
              "gradient norm": {m: _series(train, "grad_norm", m) for m in fields("grad_norm")},
              "samples/s": {"samples/s": _series(train, "samples_per_second")},
              "loss weights": {k: _series(train, "loss_weight", k) for k in fields("loss_weight")},
              "validation": {f"{r_split} {k}" if len({r['split'] for r in evals}) > 1 else k:
                             _series([r for r in evals if r["split"] == r_split], k)
                             for r_split in dict.fromkeys(r["split"] for r in evals)
                             for k in dict.fromkeys(k for r in evals if r["split"] == r_split for k, v in r.items()
                                                    if k != "step" and isinstance(v, (int, float)))}}
    return {title: {label: line for label, line in lines.items() if line[0]}
            for title, lines in panels.items() if any(line[0] for line in lines.values())}


def training_figure(records: Sequence[Dict], title: str = "") -> Figure:
    """One panel per entry of training_panels, up to COLUMNS to a row; the axes' titles are the panel titles and the
    lines' labels the metric names."""
    panels = training_panels(records)
    if not panels:
        raise ValueError("no training records (lines with a 'step') to plot")
    columns = 2 if len(panels) == 4 else min(len(panels), COLUMNS)
    rows = -(-len(panels) // columns)
    figure = new_figure(3.6 * columns, 2.6 * rows)
    grid = figure.subplots(rows, columns, squeeze=False)
    for axes, (name, lines) in zip(grid.flat, panels.items()):
        ylabel, log = PANELS[name]
        for label, (steps, values) in lines.items():
            marker = "o" if len(steps) < 20 else None
            axes.plot(steps, values, label=label, marker=marker, markersize=3, linewidth=1.2)
        axes.set_title(name)
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        if log:
            axes.set_yscale("log")
        axes.grid(True, alpha=0.3)
        if len(lines) > 1 or name == "validation":
            axes.legend(fontsize="small")
    for axes in list(grid.flat)[len(panels):]:
        axes.remove()
    if title:
        figure.suptitle(title)
    return figure


def plot_training(run: Union[str, Path], out: Union[str, Path], title: str = "",
                  stem: str = "training") -> Tuple[Figure, List[Path]]:
    """`run`'s metrics.jsonl drawn into `out`/`stem`.png and .svg -> (the figure, the two paths)."""
    figure = training_figure(read_metrics(run), title or Path(run).name)
    return figure, list(save_figure(figure, Path(out) / stem))
