"""The benchmarks' comparison charts: one grouped-bar (or line) chart from the rows a benchmark already collects,
the peers side by side, titled with the machine the benchmark ran on (its CPU model and ISA, as it prints them).

A benchmark adds `add_plot_option(parser)` and one `plot_comparison(args.plot, rows, ...)` call; rows are plain
dicts, one per (x, series) point, e.g. {"graph": "vqa", "peer": "ONNX Runtime", "ms": 1.9}.
"""
import argparse
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from matplotlib.figure import Figure

from mindvl.plots.figure import new_figure, save_figure, written

Key = Union[str, Callable[[Dict[str, Any]], Any]]


def _get(key: Key, row: Dict[str, Any]) -> Any:
    return key(row) if callable(key) else row[key]


def _ordered(values) -> List[Any]:
    """Distinct values in first-seen order (the benchmark's own order)."""
    return list(dict.fromkeys(values))


def bar_gid(panel: Any, x: Any, series: Any) -> str:
    """The gid (SVG id) of one bar or line point: panel/x/series."""
    return f"{panel}/{x}/{series}"


def comparison_figure(rows: Sequence[Dict[str, Any]], *, x: Key, series: Key, value: Union[str, Dict[str, str]],
                      title: str, machine: str = "", panel: Optional[Key] = None, ylabel: str = "",
                      kind: str = "bar", log: bool = False) -> Figure:
    """Grouped bars (kind "bar") or one line per series (kind "line") of `rows`.

    x, series, panel: a row's key, or a function of the row giving the label. value: the key of the figure
    drawn, with `ylabel` its axis (one panel per distinct `panel`), or {key: axis label} (one panel per key; a
    row without the key is left out of that panel). `machine` goes under the title; `log`: a logarithmic y axis
    (figures spanning decades, as per-graph latencies do)."""
    panels: List[Tuple[Any, str, str]] = []  # (panel label, value key, y label)
    if isinstance(value, dict):
        panels = [(label, key, label) for key, label in value.items()]
    else:
        names = _ordered(_get(panel, row) for row in rows) if panel is not None else [""]
        panels = [(name, value, ylabel) for name in names]
    figure = new_figure(max(6.0, 4.2 * len(panels)), 4.6)
    # panels of one figure share its axis; panels of different figures each have their own
    axes = figure.subplots(1, len(panels), squeeze=False, sharey=not isinstance(value, dict))[0]
    for ax, (name, key, label) in zip(axes, panels):
        mine = [row for row in rows if key in row and row[key] is not None
                and (panel is None or isinstance(value, dict) or _get(panel, row) == name)]
        xs = _ordered(_get(x, row) for row in mine)
        names = _ordered(_get(series, row) for row in mine)
        alone = x == series  # one bar per x (each peer its own x): full width, centred
        width = 0.8 if alone else 0.8 / max(len(names), 1)
        for index, label_series in enumerate(names):
            points = {_get(x, row): row[key] for row in mine if _get(series, row) == label_series}
            positions = [i for i, v in enumerate(xs) if v in points]
            heights = [points[xs[i]] for i in positions]
            if kind == "line":
                ax.plot(positions, heights, marker="o", label=str(label_series),
                        gid=bar_gid(name, "*", label_series))
                continue
            offset = 0.0 if alone else (index - (len(names) - 1) / 2) * width
            for position, height in zip(positions, heights):
                ax.bar(position + offset, height, width=width * 0.95, color=f"C{index % 10}",
                       label=str(label_series) if position == positions[0] else None,
                       gid=bar_gid(name, xs[position], label_series))
        ax.set_xticks(range(len(xs)))
        crowded = len(xs) > 4  # long labels side by side overlap: slanted
        ax.set_xticklabels([str(v) for v in xs], fontsize=8, rotation=30 if crowded else 0,
                           ha="right" if crowded else "center")
        ax.set_xlabel(x if isinstance(x, str) else "")
        ax.set_ylabel(label)
        if not isinstance(value, dict) and panel is not None:
            ax.set_title(str(name), fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        if not alone:  # one bar per x: the ticks name them
            ax.legend(fontsize=7)
    heading = title + ("\n" + "\n".join(textwrap.wrap(machine, 120)) if machine else "")
    figure.suptitle(heading, fontsize=10)
    return figure


def add_plot_option(parser: argparse.ArgumentParser) -> None:
    """The benchmarks' --plot STEM."""
    parser.add_argument("--plot", metavar="STEM", help="also draw the comparison into STEM.png and STEM.svg")


def plot_comparison(stem: Optional[Union[str, Path]], rows: Sequence[Dict[str, Any]], **figure) -> List[Path]:
    """Draw comparison_figure(rows, **figure) into `stem`.png/.svg and print where; nothing when stem is None."""
    if not stem:
        return []
    paths = list(save_figure(comparison_figure(rows, **figure), stem))
    print(written(paths), flush=True)
    return paths
