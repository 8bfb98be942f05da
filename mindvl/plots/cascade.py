"""The edge-cloud cascade's calibration as a picture: accuracy against the share of questions sent to the cloud
(every threshold the calibration swept), and the expected latency a question costs at each share, with the
chosen threshold marked on both.

Input: a calibration as `mindvl lite calibrate` writes it (Calibration.to_dict(), or the JSON file read back).
Latency: the calibration's medians of one question alone on the device (edge_ms) and on the cloud (cloud_ms);
the cascade asks the cloud after the device, so at cloud rate r a question costs edge_ms + r x cloud_ms on
average. Without a cloud timing (calibrated without --cloud URL) only accuracy is drawn, and the legend says why.
"""
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from matplotlib.figure import Figure

from mindvl.plots.figure import new_figure, save_figure

CHOSEN = "chosen"  # gid of the marker at the chosen threshold (an id in the SVG)


def expected_latency_ms(edge_ms: float, cloud_ms: float, cloud_rate: float) -> float:
    """Mean time a question costs when a `cloud_rate` share of them also waits for the cloud."""
    return edge_ms + cloud_rate * cloud_ms


def _cloud_label(cloud: Dict[str, Any]) -> str:
    if cloud.get("measured"):
        return f"cloud measured: {cloud['accuracy']:.1%} right ({cloud.get('address', '')})"
    return f"cloud assumed right {cloud.get('accuracy', 1.0):.0%} of the time"


def _confidence(calibration: Dict[str, Any]) -> str:
    if calibration.get("nll"):
        return f"softmax confidence at T {calibration['temperature']:.3f}"
    return "confidence exp(mean token log-probability)"


def cascade_figure(calibration: Dict[str, Any]) -> Figure:
    """The figure (module docstring) of one calibration dict."""
    curve: List[Dict[str, Any]] = calibration["curve"]
    chosen, threshold = calibration["chosen"], calibration["threshold"]
    latency = calibration.get("latency") or {}
    edge_ms, cloud_ms = latency.get("edge_ms"), latency.get("cloud_ms")
    timed = edge_ms is not None and cloud_ms is not None
    figure = new_figure(11.0 if timed else 7.0, 4.6)
    axes = figure.subplots(1, 2 if timed else 1, squeeze=False)[0]

    rates = [100 * row["cloud_rate"] for row in curve]
    ax = axes[0]
    ax.plot(rates, [100 * row["accuracy"] for row in curve], color="C0", label="overall (edge + cloud)")
    answered = [(100 * row["cloud_rate"], 100 * row["edge_accuracy"]) for row in curve
                if row["edge_accuracy"] is not None]
    ax.plot([r for r, _ in answered], [a for _, a in answered], color="C1", linestyle="--",
            label="edge, on the questions it keeps")
    x, y = 100 * chosen["cloud_rate"], 100 * chosen["accuracy"]
    ax.axvline(x, color="0.5", linestyle=":", linewidth=1)
    ax.plot([x], [y], marker="*", markersize=14, color="C3", linestyle="none", gid=CHOSEN,
            label=f"threshold {threshold:.4f}: {x:.0f}% to the cloud, {y:.1f}% right")
    ax.plot([], [], linestyle="none", label=_cloud_label(calibration.get("cloud", {})))
    if not timed:
        why = "latency not drawn: the cloud was not timed (calibrate with --cloud URL)"
        if edge_ms is not None:
            why += f"; edge {edge_ms:.1f} ms a question"
        ax.plot([], [], linestyle="none", label=why)
    ax.set_xlabel("questions sent to the cloud (%)")
    ax.set_ylabel("accuracy (%)")
    ax.set_xlim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # the curves climb to the right: usually a free corner at the top or bottom
    ax.set_title("accuracy against the cloud rate", fontsize=10)

    if timed:
        ax = axes[1]
        ax.plot([0, 100], [expected_latency_ms(edge_ms, cloud_ms, r) for r in (0, 1)], color="C2",
                label=f"edge {edge_ms:.1f} ms + rate x cloud {cloud_ms:.1f} ms (medians of "
                      f"{latency.get('questions', '?')} questions alone)")
        expected = expected_latency_ms(edge_ms, cloud_ms, chosen["cloud_rate"])
        ax.axvline(x, color="0.5", linestyle=":", linewidth=1)
        ax.plot([x], [expected], marker="*", markersize=14, color="C3", linestyle="none", gid=CHOSEN + "_latency",
                label=f"threshold {threshold:.4f}: {expected:.1f} ms a question")
        ax.set_xlabel("questions sent to the cloud (%)")
        ax.set_ylabel("expected ms per question")
        ax.set_xlim(0, 100)
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title("latency against the cloud rate", fontsize=10)

    package = calibration.get("package", {})
    figure.suptitle(f"cascade of {package.get('name', '?')} v{package.get('version', '?')}: "
                    f"{calibration.get('examples', len(curve))} {calibration.get('split', '')} questions "
                    f"({calibration.get('modality', '')}), {_confidence(calibration)}", fontsize=11)
    return figure


def plot_cascade(calibration: Dict[str, Any], stem: Union[str, Path]) -> Tuple[Path, Path]:
    """Write the figure as `stem`.png and `stem`.svg."""
    return save_figure(cascade_figure(calibration), stem)

