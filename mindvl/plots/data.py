"""A built data set's pictures: what the build quarantined (by reason, per split), its sequence lengths (tokens
and mel frames per example, or tokens per conversation for a generative recipe, against the longest the model
takes) and the fill the recipe's packer reaches per bucket.

Inputs are plain data: the build's report (`<data>/report.json` as a dict: `skips_by_split`, split -> reason ->
count, in each reason's unit) and mindvl.data.reading.lengths.data_lengths (lengths, limits, and Packer.bucket_fill or
ConversationPacker.bucket_fill).
"""
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from matplotlib.figure import Figure

from mindvl.plots.figure import new_figure, save_figure

REPORT_FILE = "report.json"  # mindvl.data.root's name for the build's report
QUARANTINE_FILE = "quarantine.jsonl"  # one line per dropped item: split, reason, ...


def quarantine_counts(report: Dict, quarantine: Sequence[Dict] = ()) -> Dict[str, Dict[str, int]]:
    """split -> reason -> count of what the build dropped: the report's skips_by_split, else counted from the
    lines of quarantine.jsonl (a report written before it had them). Zero counts left out."""
    counts = report.get("skips_by_split")
    if counts is None:
        counts = {}
        for line in quarantine:
            split = counts.setdefault(line["split"], {})
            split[line["reason"]] = split.get(line["reason"], 0) + 1
    return {split: {reason: n for reason, n in reasons.items() if n} for split, reasons in counts.items()
            if any(reasons.values())}


def quarantine_figure(counts: Dict[str, Dict[str, int]]) -> Optional[Figure]:
    """Horizontal bars, one group per reason, one bar per split (its label the split, its width the count);
    None when nothing was dropped."""
    reasons = sorted({r for split in counts.values() for r in split}, key=lambda r: -sum(s.get(r, 0)
                                                                                          for s in counts.values()))
    if not reasons:
        return None
    splits = list(counts)
    figure = new_figure(6.5, 0.9 + 0.28 * len(reasons) * len(splits))
    axes = figure.subplots()
    height = 0.8 / len(splits)
    for index, split in enumerate(splits):
        positions = [r + (index - (len(splits) - 1) / 2) * height for r in range(len(reasons))]
        widths = [counts[split].get(reason, 0) for reason in reasons]
        bars = axes.barh(positions, widths, height, label=split)
        axes.bar_label(bars, labels=[str(w) if w else "" for w in widths], padding=2, fontsize="small")
    axes.set_yticks(range(len(reasons)), reasons)
    axes.invert_yaxis()
    axes.set_xlabel("items dropped (the reason's unit: image, example, clip, ...)")
    axes.set_title("quarantined, by reason")
    axes.legend(title="split", fontsize="small")
    axes.margins(x=0.12)
    return figure


def lengths_figure(lengths: Dict[str, List[int]], limits: Dict[str, int], split: str = "train") -> Figure:
    """One histogram per sequence kind (empty ones left out), the model's limit as a dashed line."""
    kinds = [name for name, values in lengths.items() if len(values)]
    figure = new_figure(3.6 * max(len(kinds), 1), 2.8)
    for axes, name in zip(figure.subplots(1, len(kinds), squeeze=False)[0], kinds):
        values = lengths[name]
        low, high = min(values), max(values)
        few = high - low <= 60  # one bar per value; the limit line widens the axis, not the bars' bins
        axes.hist(values, bins=range(low, high + 2) if few else 40, color="tab:blue", align="left" if few else "mid")
        if name in limits:
            axes.axvline(limits[name], color="tab:red", linestyle="--", label=f"limit {limits[name]}")
            axes.legend(fontsize="small")
        axes.set_title(name)
        axes.set_xlabel(name.split()[-1])
        axes.set_ylabel(f"{split} items")
    figure.suptitle(f"sequence lengths ({split})")
    return figure


def bucket_label(bucket: Dict) -> str:
    """A bar's tick: rows x length (a row bucket; "padded" under the fallback) or the count of a label bucket
    ("largest" under the one the largest batch needs)."""
    if "rows" in bucket:
        return f"{bucket['rows']}x{bucket['length']}" + ("\npadded" if bucket["padded"] else "")
    return f"{bucket['labels']}" + ("\nlargest" if bucket["padded"] else "")


def packing_figure(packing: Dict[str, List[Dict]], batch_size: int = 0) -> Figure:
    """Per stream, one bar per bucket (rows x length, or a label count; the last the padded fallback, grey): the
    share of its slots filled, labelled with how many of the drawn batches took it."""
    figure = new_figure(3.6 * len(packing), 3.0)
    for axes, (stream, buckets) in zip(figure.subplots(1, len(packing), squeeze=False)[0], packing.items()):
        labels = [bucket_label(b) for b in buckets]
        fills = [100 * (b["fill"] or 0.0) for b in buckets]
        bars = axes.bar(range(len(buckets)), fills, color=["tab:gray" if b["padded"] else "tab:green"
                                                             for b in buckets])
        total = sum(b["batches"] for b in buckets)
        axes.bar_label(bars, labels=[f"{f:.0f}%\n{b['batches']}/{total}" if b["batches"] else f"0/{total}"
                                     for f, b in zip(fills, buckets)], fontsize="small")
        axes.set_xticks(range(len(buckets)), labels)
        axes.set_ylim(0, 118)
        axes.set_ylabel("fill (%)")
        axes.set_title(stream)
    figure.suptitle("packing: fill per bucket, batches that took it" + (f" (batch {batch_size})"
                                                                      if batch_size else ""))
    return figure


def data_figures(report: Dict, view: Optional[Dict] = None, quarantine: Sequence[Dict] = ()) -> Dict[str, Figure]:
    """File stem -> figure: data_quarantine (when anything was dropped), and with `view`
    (mindvl.data.reading.lengths.data_lengths) data_lengths and data_packing."""
    figures = {}
    dropped = quarantine_figure(quarantine_counts(report, quarantine))
    if dropped is not None:
        figures["data_quarantine"] = dropped
    if view:
        figures["data_lengths"] = lengths_figure(view["lengths"], view["limits"], view.get("split", "train"))
        figures["data_packing"] = packing_figure(view["packing"], view.get("batch_size", 0))
    return figures


def plot_data(report: Dict, view: Optional[Dict], out: Union[str, Path],
              quarantine: Sequence[Dict] = ()) -> Tuple[Dict[str, Figure], List[Path]]:
    """data_figures written into `out` (PNG and SVG each) -> (the figures, the paths)."""
    figures = data_figures(report, view, quarantine)
    return figures, [path for stem, figure in figures.items() for path in save_figure(figure, Path(out) / stem)]
