"""`mindvl lite calibrate --plot` (mindvl/plots/cascade.py) on the session's small packages: the swept curve drawn
point for point, the chosen threshold marked where the calibration put it, the expected latency edge + rate x
cloud from the latencies the calibration measured, accuracy alone (and the legend saying why) when the cloud was
not timed, for a classifier and a generative package; a calibration file from before the latencies still loads
and draws."""
import json

import pytest
from saved import assert_png_and_svg, stem_files

from mindvl.cli import main
from mindvl.lite.calibration import load_calibration
from mindvl.plots.cascade import CHOSEN, cascade_figure, expected_latency_ms


def _marker(figure, gid):
    (line,) = [line for axes in figure.axes for line in axes.get_lines() if line.get_gid() == gid]
    return line


def _legend(figure, index=0):
    return [text.get_text() for text in figure.axes[index].get_legend().get_texts()]


@pytest.fixture(scope="module")
def calibrated(package, root, live_server, tmp_path_factory):
    """(the calibration file's dict, the folder holding it and its plots) of `mindvl lite calibrate --cloud
    --plot` on the session's package and a live server of it."""
    folder = tmp_path_factory.mktemp("cascade_plots")
    main(["lite", "calibrate", str(package), "--data", str(root), "--cloud", live_server.rest_url,
          "--out", str(folder / "calibration.json"), "--plot", str(folder / "cascade")])
    return json.loads((folder / "calibration.json").read_text()), folder


def test_calibrate_plot_marks_the_chosen_threshold_and_the_measured_latencies(calibrated):
    data, folder = calibrated
    svg = assert_png_and_svg(stem_files(folder / "cascade"))
    assert f'id="{CHOSEN}"' in svg

    latency = data["latency"]
    assert latency["edge_ms"] > 0 and latency["cloud_ms"] > 0 and latency["questions"] == min(16, data["examples"])
    figure = cascade_figure(data)
    assert len(figure.axes) == 2
    chosen = _marker(figure, CHOSEN)
    assert chosen.get_xdata()[0] == pytest.approx(100 * data["chosen"]["cloud_rate"])
    assert chosen.get_ydata()[0] == pytest.approx(100 * data["chosen"]["accuracy"])
    assert f"threshold {data['threshold']:.4f}" in chosen.get_label()
    overall = figure.axes[0].get_lines()[0]  # the sweep, every threshold the calibration tried
    assert list(overall.get_xdata()) == pytest.approx([100 * row["cloud_rate"] for row in data["curve"]])
    assert list(overall.get_ydata()) == pytest.approx([100 * row["accuracy"] for row in data["curve"]])
    cost = _marker(figure, CHOSEN + "_latency")
    assert cost.get_ydata()[0] == pytest.approx(
        latency["edge_ms"] + data["chosen"]["cloud_rate"] * latency["cloud_ms"])
    assert expected_latency_ms(2.0, 10.0, 0.3) == pytest.approx(5.0)
    assert any("cloud measured" in text for text in _legend(figure))


def test_mindvl_plot_draws_a_calibrated_folder(calibrated, tmp_path, capsys):
    """`mindvl plot` finds the calibration.json (as `mindvl lite calibrate` leaves it in a package folder)."""
    _, folder = calibrated
    assert main(["plot", str(folder), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == ["plots:", f"{tmp_path}/cascade.png,", f"{tmp_path}/cascade.svg"]
    assert (tmp_path / "cascade.svg").read_text() == (folder / "cascade.svg").read_text()  # the same figure


def test_a_calibration_without_cloud_timings_draws_accuracy_alone_and_says_why(calibrated, tmp_path):
    data = {**calibrated[0], "latency": {**calibrated[0]["latency"], "cloud_ms": None}}  # calibrated without --cloud
    figure = cascade_figure(data)
    assert len(figure.axes) == 1
    assert any("cloud was not timed" in text for text in _legend(figure))

    del data["latency"]  # a file written before the latencies were measured
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    calibration = load_calibration(old)
    assert calibration.latency == {} and calibration.threshold == data["threshold"]
    figure = cascade_figure(calibration.to_dict())
    assert len(figure.axes) == 1 and _marker(figure, CHOSEN).get_ydata()[0] == pytest.approx(
        100 * data["chosen"]["accuracy"])


def test_a_generative_packages_calibration_draws_its_confidence_and_latency(generative_package, tmp_path, capsys):
    cfg, package = generative_package
    main(["lite", "calibrate", str(package), "--data", str(cfg.data.root), "--split", "test", "--limit", "2",
          "--target-cloud-rate", "0.5", "--out", str(tmp_path / "cal.json"), "--plot", str(tmp_path / "gen")])
    assert "exp(mean token log-probability)" in capsys.readouterr().out
    assert_png_and_svg(stem_files(tmp_path / "gen"))
    data = json.loads((tmp_path / "cal.json").read_text())
    assert data["latency"]["edge_ms"] > 0 and data["latency"]["questions"] == 2
    figure = cascade_figure(data)
    assert "exp(mean token log-probability)" in figure.get_suptitle()
    assert _marker(figure, CHOSEN).get_xdata()[0] == pytest.approx(100 * data["chosen"]["cloud_rate"])
