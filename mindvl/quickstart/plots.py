"""The quickstarts' pictures, written into `<workdir>/plots` next to summary.json: each training stage's curves
(`training.png`, or `training_<recipe>.png` for a generative recipe's stages), the data build's quarantine and
the sequence lengths and packing fill of the recipe trained last (a generative recipe's conversations), and the
classifier's cascade: accuracy and expected latency against the cloud rate, its threshold marked (mindvl/plots)."""
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from mindvl.config import Config

PLOTS = "plots"


def write_plots(work: Path, data_cfg: Config, report: Dict, runs: Sequence[Tuple[str, str]],
                calibration: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """`runs`: (file stem, run folder) of each training stage; `data_cfg`: the recipe whose lengths and packing
    are drawn (mindvl.data.reading.lengths.data_lengths: a generative recipe's conversation packing, the classifier's
    streams otherwise); `calibration`: the cascade's (`cascade.png`). -> {"folder", "files": the PNGs,
    "seconds"} for the summary (the SVGs lie beside them)."""
    from mindvl.data.reading.lengths import data_lengths
    from mindvl.plots.data import plot_data
    from mindvl.plots.training import plot_training

    start = time.perf_counter()
    folder = work / PLOTS
    paths = [path for stem, run in runs for path in plot_training(run, folder, Path(run).name, stem)[1]]
    paths += plot_data(report, data_lengths(data_cfg), folder)[1]
    if calibration is not None:
        from mindvl.plots.cascade import plot_cascade
        paths += plot_cascade(calibration, folder / "cascade")
    return {"folder": str(folder), "files": [p.name for p in paths if p.suffix == ".png"],
            "seconds": round(time.perf_counter() - start, 1)}


def plots_row(plots: Dict[str, Any]) -> list:
    """The summary table's row naming them."""
    return ["plots", f"{plots['folder']}: {', '.join(plots['files'])} (+ SVG; {plots['seconds']:.1f} s)"]
