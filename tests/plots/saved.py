"""What the picture tests check of every figure written: a PNG and an SVG that parse (mindvl.plots.figure)."""
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png_and_svg(paths: Sequence[Path]) -> str:
    """`paths`: the (png, svg) save_figure wrote; both are what their names say. -> the SVG's text."""
    png, svg = paths
    assert png.suffix == ".png" and png.read_bytes()[:8] == PNG_SIGNATURE
    assert svg.suffix == ".svg" and ET.parse(svg).getroot().tag.endswith("svg")
    return svg.read_text()


def stem_files(stem: Path) -> Sequence[Path]:
    """(stem.png, stem.svg): the files a figure saved as `stem` has."""
    return stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")
