"""`mindvl plan --plot` (mindvl/plots/plan.py): a stacked bar per strategy whose segments are the planner's
per-rank bytes (parameters, gradients, optimizer states, activations in flight; their sum its total), the cap
drawn, and the strategies over it hatched and named in red; with --search the listed strategies and the faster
ones the cap rejected."""
import pytest
from matplotlib.colors import same_color
from saved import assert_png_and_svg, stem_files

from mindvl.cli import main
from mindvl.config import load_config
from mindvl.parallel.hardware import Hardware
from mindvl.parallel.planner import plan, rank
from mindvl.parallel.strategy import create_strategy
from mindvl.plots.plan import GB, MEMORY_KINDS, bar_gid, memory_figure, over_cap


def _segments(figure):
    return {patch.get_gid(): patch for patch in figure.axes[0].patches if patch.get_gid()}


def test_the_bars_are_the_planners_bytes_by_kind_stacked_to_its_total(tmp_path, capsys):
    cfg = load_config("fusion-12b", ["data.batch_size=64"])
    strategy = create_strategy("dp2-mp4")
    result = plan(cfg, strategy).to_dict()
    assert result["total_bytes"] > 64 * GB  # over the device's memory: marked
    figure = memory_figure([{"name": strategy.name, "plan": result}], 64 * GB)
    segments = _segments(figure)
    bottom = 0.0
    for key, _ in MEMORY_KINDS:
        bar = segments[bar_gid(strategy.name, key)]
        assert bar.get_height() == pytest.approx(result[key] / GB)
        assert bar.get_y() == pytest.approx(bottom)
        bottom += bar.get_height()
    assert bottom == pytest.approx(result["total_bytes"] / GB)  # the kinds are all the planner counts
    assert [line.get_ydata()[0] for line in figure.axes[0].get_lines()] == [64]  # the cap
    assert over_cap([{"name": strategy.name, "plan": result}], 64 * GB) == [strategy.name]
    assert same_color(figure.axes[0].get_xticklabels()[0].get_color(), "C3")

    main(["plan", "--config", "fusion-12b", "--set", "data.batch_size=64", "--strategy", "dp2-mp4",
          "--plot", str(tmp_path / "one")])
    out = capsys.readouterr().out
    assert out.startswith("strategy dp2-mp4") and out.rstrip().endswith(f"{tmp_path / 'one'}.svg")
    assert f'id="{bar_gid(strategy.name, "activation_bytes")}"' in assert_png_and_svg(stem_files(tmp_path / "one"))


def test_search_plot_shows_the_listed_strategies_and_marks_the_faster_ones_over_the_cap(tmp_path, capsys):
    overrides = ["data.batch_size=64"]
    cfg = load_config("fusion-12b", overrides)
    main(["plan", "--config", "fusion-12b", "--set", *overrides, "--search", "--devices", "64", "--memory-cap-gb", "20",
          "--top", "3", "--plot", str(tmp_path / "search")])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:4]]
    every = rank(cfg, 64, Hardware())
    fitting = [(s, p) for s, p in every if p.total_bytes <= 20e9]  # search(cfg, 64, 20)
    assert listed == [s.name for s, _ in fitting[:3]]
    rejected = [(s, p) for s, p in every if p.total_bytes > 20e9 and p.step_time_s < fitting[0][1].step_time_s]
    assert rejected, "the cap of 20 GB should reject the fastest strategies of this recipe"
    svg = assert_png_and_svg(stem_files(tmp_path / "search"))
    for strategy, _ in [*fitting[:3], *rejected[:3]]:
        assert f'id="{bar_gid(strategy.name, "parameter_bytes")}"' in svg

    strategies = [{"name": s.name, "plan": p.to_dict()} for s, p in [*rejected[:3], *fitting[:3]]]
    figure = memory_figure(strategies, 20e9)
    assert over_cap(strategies, 20e9) == [s.name for s, _ in rejected[:3]]
    segments = _segments(figure)
    for label, strategy in zip(figure.axes[0].get_xticklabels(), strategies):
        over = strategy["name"] in over_cap(strategies, 20e9)
        assert label.get_text().startswith(strategy["name"])
        assert same_color(label.get_color(), "C3") == over
        assert (segments[bar_gid(strategy["name"], "optimizer_bytes")].get_hatch() == "//") == over
        assert (sum(strategy["plan"][k] for k, _ in MEMORY_KINDS) > 20e9) == over
