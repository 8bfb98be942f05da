"""The data build's pictures (mindvl/plots/data.py over mindvl/data/reading/lengths.py) from the session's small built
data set: the quarantine bars are the report's counts, the histograms hold every example, the packing bars
are Packer.bucket_fill's; for a generative recipe (vlm-tiny over the same root's conversation tables) the
histogram holds every trainable conversation and the packing bars are what its training stream packs."""
import json
from pathlib import Path

import numpy as np

from conftest import small_generative_config, small_generative_overrides
from saved import assert_png_and_svg


def _bars(axes):
    """label -> the widths (horizontal) or heights of its bars."""
    return {c.get_label(): [p.get_width() if c.orientation == "horizontal" else p.get_height() for p in c.patches]
            for c in axes.containers}


def test_the_data_figures_show_the_reports_quarantine_every_example_and_the_packing_fill(small_cfg, small_report,
                                                                                         tmp_path):
    from mindvl.data.reading.lengths import FILL_BATCHES, data_lengths
    from mindvl.data.reading.splits import split_rows
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


def test_a_generative_recipes_packing_picture_is_what_its_training_stream_packs(small_cfg, small_report, tmp_path):
    """The bars of the conversation rows and of the labels equal, bucket for bucket, the packed micro-batches the
    training stream itself hands the model (ConversationStream: same conversations, order and packer)."""
    from mindvl.data.reading.conversation_loader import ConversationStream
    from mindvl.data.reading.lengths import data_lengths
    from mindvl.plots.data import plot_data

    cfg = small_generative_config(small_cfg.data.root)
    batches = 6
    view = data_lengths(cfg, batches=batches)
    figures, paths = plot_data({}, view, tmp_path)
    assert list(figures) == ["data_lengths", "data_packing"]
    assert_png_and_svg(paths[-2:])

    stream = ConversationStream(cfg, 16, 16, shard_id=0, num_shards=1)  # vlm-tiny's slots at 64 px, 128 frames
    assert view["batch_size"] == stream.micro_batch_size
    taken = {"conversation": {}, "labels": {}}  # bucket -> [batches, useful slots]
    drawn = iter(stream)
    for _ in range(batches):
        _, batch = next(drawn)
        segment, weight = (batch[stream.columns.index(name)].asnumpy() for name in ("segment", "label_weight"))
        for name, bucket, useful in (("conversation", segment.shape[0], (segment > 0).sum()),
                                     ("labels", weight.shape[0], weight.sum())):
            counts = taken[name].setdefault(int(bucket), [0, 0])
            counts[0], counts[1] = counts[0] + 1, counts[1] + useful
    drawn.close()
    slots = {"conversation": stream.packer.length, "labels": 1}
    packing = {axes.get_title(): axes for axes in figures["data_packing"].axes}
    assert list(packing) == list(view["packing"]) == ["conversation", "labels"]
    for name, buckets in view["packing"].items():
        size = "rows" if name == "conversation" else "labels"
        assert [b[size] for b in buckets] == (stream.packer.row_buckets if size == "rows"
                                              else stream.packer.label_buckets)
        assert [b["padded"] for b in buckets] == [False] * (len(buckets) - 1) + [True]
        expected = {bucket: 100 * useful / (bucket * slots[name] * n) for bucket, (n, useful) in taken[name].items()}
        assert {b[size]: b["batches"] for b in buckets if b["batches"]} == {k: v[0] for k, v in taken[name].items()}
        heights = next(iter(_bars(packing[name]).values()))
        np.testing.assert_allclose(heights, [expected.get(b[size], 0.0) for b in buckets], atol=0.01)  # fill: 4 places
    ticks = [t.get_text() for t in packing["conversation"].get_xticklabels()]
    assert ticks[-1] == f"{stream.micro_batch_size}x{cfg.data.packing.length}\npadded"

    histogram = figures["data_lengths"].axes[0]
    assert histogram.get_title() == "conversation tokens"
    assert sum(p.get_height() for p in histogram.patches) == len(stream.rows)
    assert sorted(view["lengths"]["conversation tokens"]) == sorted(stream.sizes.tokens[stream.rows].tolist())
    assert view["limits"] == {"conversation tokens": cfg.data.packing.length}


def test_mindvl_plot_draws_a_data_sets_conversation_packing_for_a_generative_recipe(small_cfg, small_report, tmp_path):
    from mindvl.cli import main

    overrides = [arg for override in small_generative_overrides(small_cfg.data.root)
                 if not override.startswith("data.root=") for arg in ("--set", override)]
    assert main(["plot", small_cfg.data.root, "--config", "vlm-tiny", "--out", str(tmp_path), *overrides]) == 0
    svg = (tmp_path / "data_packing.svg").read_text()  # matplotlib names each text in a comment
    assert "<!-- conversation -->" in svg and "<!-- labels -->" in svg and "<!-- fusion -->" not in svg
    assert "<!-- conversation tokens -->" in (tmp_path / "data_lengths.svg").read_text()
