"""The benchmarks' comparison chart (mindvl/plots/benchmarks.py): a bar per (x, series) at the row's figure, a panel
per value key or per panel label, lines for kind "line", the machine under the title; and every benchmark that
compares peers side by side takes --plot STEM."""
import argparse
import ast
from pathlib import Path

import pytest
from saved import assert_png_and_svg

from mindvl.plots.benchmarks import add_plot_option, bar_gid, comparison_figure, plot_comparison

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# the benchmarks that put mindvl next to a peer (or one setting next to another) and draw it
WITH_PLOT = ("serving_load", "serving_generate", "lite_latency", "lite_generate", "train_step", "generate")

# lite_latency's rows as its --plot passes them (figures from a run on the project's machine)
LATENCY = [{"graph": graph, "threads": f"{threads} thread(s)", "peer": peer, "ms": ms}
           for threads, graph, peer, ms in [(1, "vqa", "Lite 2.0", 5.1), (1, "vqa", "ONNX Runtime", 3.9),
                                           (1, "text_embed", "Lite 2.0", 0.9), (1, "text_embed", "ONNX Runtime", 0.7),
                                           (2, "vqa", "Lite 2.0", 3.6), (2, "vqa", "ONNX Runtime", 2.8)]]


def _bars(figure):
    return {patch.get_gid(): patch for axes in figure.axes for patch in axes.patches if patch.get_gid()}


def test_each_bar_is_its_rows_figure_grouped_by_x_with_a_panel_per_label():
    figure = comparison_figure(LATENCY, x="graph", series="peer", value="ms", panel="threads", ylabel="ms",
                               title="latency", machine="Intel Xeon; x86-64-v4 (avx2 avx512f)")
    assert [axes.get_title() for axes in figure.axes] == ["1 thread(s)", "2 thread(s)"]
    bars = _bars(figure)
    assert len(bars) == len(LATENCY)
    for row in LATENCY:
        assert bars[bar_gid(row["threads"], row["graph"], row["peer"])].get_height() == row["ms"]
    one = figure.axes[0]
    assert [label.get_text() for label in one.get_xticklabels()] == ["vqa", "text_embed"]
    vqa = [bars[bar_gid("1 thread(s)", "vqa", peer)] for peer in ("Lite 2.0", "ONNX Runtime")]
    assert all(abs(bar.get_x() + bar.get_width() / 2) < 0.5 for bar in vqa)  # side by side at x = 0
    assert vqa[0].get_x() < vqa[1].get_x()
    assert [t.get_text() for t in one.get_legend().get_texts()] == ["Lite 2.0", "ONNX Runtime"]
    assert "Intel Xeon; x86-64-v4 (avx2 avx512f)" in figure.get_suptitle()


def test_a_panel_per_value_key_and_lines_for_a_scaling_series(tmp_path, capsys):
    rows = [{"clients": c, "batching": b, "throughput": t, "p99_ms": p}
            for c, b, t, p in [(1, False, 80, 13), (8, False, 90, 95), (1, True, 78, 14), (8, True, 300, 30)]]
    series = lambda r: f"batching {'on' if r['batching'] else 'off'}"  # noqa: E731
    paths = plot_comparison(tmp_path / "load", rows, x="clients", series=series, kind="line", machine="cpu",
                            value={"throughput": "requests/s", "p99_ms": "p99 (ms)"}, title="serving")
    assert capsys.readouterr().out.strip() == f"plots: {paths[0]}, {paths[1]}"
    assert_png_and_svg(paths)
    figure = comparison_figure(rows, x="clients", series=series, kind="line", title="serving",
                               value={"throughput": "requests/s", "p99_ms": "p99 (ms)"})
    throughput, p99 = figure.axes
    assert throughput.get_ylabel() == "requests/s" and p99.get_ylabel() == "p99 (ms)"
    lines = {line.get_label(): list(line.get_ydata()) for line in throughput.get_lines()}
    assert lines == {"batching off": [80, 90], "batching on": [78, 300]}
    assert plot_comparison(None, rows, x="clients", series=series, value="throughput", title="") == []


def test_a_row_without_a_panels_figure_is_left_out_of_it():
    rows = [{"peer": "mindvl", "step_ms": 240.0}, {"peer": "torch", "step_ms": 227.0, "compile_s": 30.0}]
    figure = comparison_figure(rows, x="peer", series="peer", title="step",
                               value={"step_ms": "ms a step", "compile_s": "compile s"})
    assert len(figure.axes[0].patches) == 2 and len(figure.axes[1].patches) == 1


def test_the_option_is_one_flag():
    parser = argparse.ArgumentParser()
    add_plot_option(parser)
    assert parser.parse_args(["--plot", "x/y"]).plot == "x/y" and parser.parse_args([]).plot is None


def _calls(tree, name):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == name]


@pytest.mark.parametrize("name", WITH_PLOT)
def test_each_peer_benchmark_adds_the_option_and_draws_its_rows_with_it(name):
    # read, not run: a benchmark's --help imports MindSpore in some of them (seconds each on 2 cores)
    tree = ast.parse((BENCHMARKS / f"{name}.py").read_text())
    assert [ast.unparse(call) for call in _calls(tree, "add_plot_option")] == ["add_plot_option(parser)"]
    (draw,) = _calls(tree, "plot_comparison")
    assert ast.unparse(draw.args[0]) == "args.plot" and {k.arg for k in draw.keywords} >= {"x", "series", "value",
                                                                                          "title", "machine"}
