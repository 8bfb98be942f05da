"""One way to make and write a figure: matplotlib's object API on the Agg canvas (no pyplot, so no display and
no global backend switched under a caller's notebook), written as PNG (for the docs and a quick look) and SVG
(for print and zoom) side by side."""
from pathlib import Path
from typing import List, Tuple, Union

from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PNG_DPI = 120


def new_figure(width: float = 8.0, height: float = 4.5) -> Figure:
    """A figure (inches) on the Agg canvas, with the layout engine that keeps labels inside it."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, stem: Union[str, Path]) -> Tuple[Path, Path]:
    """Write `stem`.png and `stem`.svg (folders made); returns both paths. The SVG has no date and fixed element
    ids, so the same data gives the same file."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")
    figure.savefig(png, dpi=PNG_DPI)
    salt = rcParams["svg.hashsalt"]
    rcParams["svg.hashsalt"] = "mindvl"
    try:
        figure.savefig(svg, metadata={"Date": None})
    finally:
        rcParams["svg.hashsalt"] = salt
    return png, svg


def written(paths: List[Path]) -> str:
    """The line a command prints after writing figures."""
    return "plots: " + ", ".join(str(p) for p in paths)
