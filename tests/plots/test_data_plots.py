"""The data build's pictures (mindvl/plots/data.py over mindvl/data/lengths.py) from the session's small built
data set: the quarantine bars are the report's counts, the histograms hold every example, the packing bars
are Packer.bucket_fill's."""
import json
from pathlib import Path

from test_training_plots import assert_png_and_svg


def _bars(axes):
    """label -> the widths (horizontal) or heights of its bars."""
    return {c.get_label(): [p.get_width() if c.orientation == "horizontal" else p.get_height() for p in c.patches]
            for c in axes.containers}


def test_the_data_figures_show_the_reports_quarantine_every_example_and_the_packing_fill(small_cfg, small_report,
                                                                                         tmp_path):
    from mindvl.data.lengths import FILL_BATCHES, data_lengths
    from mindvl.data.splits import split_rows
    from mindvl.plots.data import plot_data, quarantine_counts

    report = json.loads((Path(small_cfg.data.root) / "report.json").read_text())
    view = data_lengths(small_cfg)
    figures, paths = plot_data(report, view, tmp_path)
    for png in paths[::2]:
        assert_png_and_svg([png, png.with_suffix(".svg")])
    counts = quarantine_counts(report)
    assert list(figures) == (["data_quarantine"] if counts else []) + ["data_lengths", "data_packing"]
    if counts:
        axes = figures["data_quarantine"].axes[0]
        reasons = [label.get_text() for label in axes.get_yticklabels()]
        bars = _bars(axes)
        assert set(bars) == set(report["skips_by_split"])
        for split, widths in bars.items():
            assert dict(zip(reasons, widths)) == {r: report["skips_by_split"][split].get(r, 0) for r in reasons}
    examples = len(split_rows(small_cfg, "train"))
    histograms = {axes.get_title(): sum(p.get_height() for p in axes.patches) for axes in figures["data_lengths"].axes}
    assert histograms["question tokens"] == histograms["caption tokens"] == examples
    assert histograms["audio frames"] == len(view["lengths"]["audio frames"]) > 0
    packing = {axes.get_title(): axes for axes in figures["data_packing"].axes}
    assert list(packing) == ["text", "audio", "fusion"]
    for stream, buckets in view["packing"].items():
        assert sum(b["batches"] for b in buckets) == FILL_BATCHES
        assert [round(h, 6) for h in _bars(packing[stream])[next(iter(_bars(packing[stream])))]] == \
            [round(100 * (b["fill"] or 0), 6) for b in buckets]
        assert all(0 < b["fill"] <= 1 for b in buckets if b["batches"])


def test_quarantine_counts_come_from_the_lines_when_the_report_has_none():
    from mindvl.plots.data import quarantine_counts, quarantine_figure

    lines = [{"split": "train", "reason": "duplicate"}] * 3 + [{"split": "test", "reason": "no_caption"}]
    assert quarantine_counts({}, lines) == {"train": {"duplicate": 3}, "test": {"no_caption": 1}}
    assert quarantine_counts({"skips_by_split": {"train": {"duplicate": 0}}}, lines) == {}
    assert quarantine_figure({}) is None  # nothing dropped: no picture
