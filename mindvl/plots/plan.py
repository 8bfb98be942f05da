"""`mindvl plan --plot`: per-rank memory of parallel strategies as stacked bars, one bar per strategy, split into
what the planner counts (parameters, gradients, optimizer states, activations in flight) on the most loaded
pipeline stage, against the memory cap (a horizontal line); a strategy over the cap is hatched in red and its
name is red.

Input: plain dicts, {"name": str, "plan": Plan.to_dict()} (mindvl.parallel.planner), in the order to draw them.
"""
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mindvl.plots.figure import new_figure, save_figure

GB = 1e9
# the planner's per-rank byte counts whose sum is its total_bytes, bottom to top
MEMORY_KINDS = (("parameter_bytes", "parameters"), ("gradient_bytes", "gradients"),
                ("optimizer_bytes", "optimizer states"), ("activation_bytes", "activations in flight"))
OVER_CAP = "over the cap"
CLIP = 3.0  # bars taller than CLIP x the cap are cut at the top of the axes (their total written on them)
COLOURS = ("C0", "C1", "C2", "C4")  # per kind; red (C3) marks the cap and what is over it


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def bar_gid(name: str, kind: str) -> str:
    """The gid (SVG id) of one strategy's segment: `name`/`kind` (kind: a key of MEMORY_KINDS)."""
    return f"{name}/{kind}"


def memory_figure(strategies: Sequence[Dict[str, Any]], cap_bytes: float, cap_label: str = "",
                  title: str = "") -> Figure:
    """The figure (module docstring); `cap_label` says where the cap comes from (the device, --memory-cap-gb)."""
    count = len(strategies)
    figure = new_figure(max(5.0, 1.0 + 0.65 * count), 5.0)
    ax = figure.subplots()
    cap = cap_bytes / GB
    totals = [sum(s["plan"][key] for key, _ in MEMORY_KINDS) / GB for s in strategies]
    top = max([cap, *totals]) * 1.12
    clipped = top > CLIP * cap * 1.12
    if clipped:
        top = CLIP * cap * 1.12
    positions = list(range(count))
    for index, (key, label) in enumerate(MEMORY_KINDS):
        bottoms = [sum(s["plan"][k] for k, _ in MEMORY_KINDS[:index]) / GB for s in strategies]
        for x, strategy, bottom in zip(positions, strategies, bottoms):
            over = strategy["plan"]["total_bytes"] > cap_bytes
            ax.bar(x, strategy["plan"][key] / GB, bottom=bottom, color=COLOURS[index], width=0.7 if count > 1 else 0.4,
                   hatch="//" if over else None, edgecolor="C3" if over else "white", linewidth=0.8,
                   gid=bar_gid(strategy["name"], key))
    for x, total, strategy in zip(positions, totals, strategies):
        over = strategy["plan"]["total_bytes"] > cap_bytes
        text = f"{total:.3g} GB" + (f"\n{OVER_CAP}" if over else "")
        ax.text(x, min(total, top * 0.97), text, ha="center", va="bottom" if total < top * 0.9 else "top",
                fontsize=7, color="C3" if over else "0.2")
    line = ax.axhline(cap, color="C3", linestyle="--", linewidth=1.2,
                      label=f"cap {cap:.3g} GB" + (f" ({cap_label})" if cap_label else ""))
    handles = [line, *(Patch(facecolor=colour, edgecolor="white", label=label)
                       for colour, (_, label) in zip(COLOURS, MEMORY_KINDS))]
    if any(s["plan"]["total_bytes"] > cap_bytes for s in strategies):
        handles.append(Patch(facecolor="white", edgecolor="C3", hatch="//", label=OVER_CAP))
    ax.set_ylim(0, top)
    ax.set_xticks(positions)
    ax.set_xticklabels([f"{s['name']}\n{_ms(s['plan']['step_time_s'])}/step" for s in strategies],
                       rotation=45 if count > 3 else 0, ha="right" if count > 3 else "center", fontsize=7)
    for label, strategy in zip(ax.get_xticklabels(), strategies):
        if strategy["plan"]["total_bytes"] > cap_bytes:
            label.set_color("C3")
    ax.set_ylabel("memory per device (GB), the most loaded stage")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title + (f"\n(bars above {CLIP:g}x the cap cut at the top)" if clipped else ""), fontsize=10)
    return figure


def plot_memory(strategies: Sequence[Dict[str, Any]], cap_bytes: float, stem: Union[str, Path], cap_label: str = "",
                title: str = "") -> Tuple[Path, Path]:
    """Write the figure as `stem`.png and `stem`.svg."""
    return save_figure(memory_figure(strategies, cap_bytes, cap_label, title), stem)


def over_cap(strategies: Sequence[Dict[str, Any]], cap_bytes: float) -> List[str]:
    """The names of the strategies the figure marks as over the cap."""
    return [s["name"] for s in strategies if s["plan"]["total_bytes"] > cap_bytes]
