"""`mindvl lite calibrate` on the session's small package and the validation split its training held out:
the fitted temperature lowers the NLL, the threshold gives the target cloud rate within one question, the
curve is monotone where it must be, the cloud's accuracy can be measured against a real server, the file
round-trips into a Cascade, and bad settings or data are refused with the reason."""
import json

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.deploy.calibrate import (accuracy_curve, calibrate, edge_logits, fit_temperature, nll, split_examples,
                                     threshold_for_accuracy, threshold_for_cloud_rate)
from mindvl.lite.calibration import CALIBRATION_FILE, CalibrationError, load_calibration
from mindvl.lite.cascade import Cascade
from mindvl.lite.device import DevicePipeline, softmax


@pytest.fixture(scope="module")
def pipeline(package):
    with DevicePipeline(package) as device:
        yield device


@pytest.fixture(scope="module")
def validation(pipeline, package, root):
    """(logits, labels) of the device on the validation questions, typed."""
    logits, labels, skipped, _ = edge_logits(pipeline, split_examples(package, root, "validation"), "typed")
    assert not skipped
    return logits, labels


@pytest.fixture(scope="module")
def fitted(pipeline, package, root):
    return calibrate(package, root, "validation", target_cloud_rate=0.3, pipeline=pipeline)


def test_validation_questions_are_the_held_out_training_images(package, root, vqa_package):
    from mindvl.data.reading.splits import split_rows

    examples = split_examples(package, root, "validation")
    assert len(examples) == len(split_rows(vqa_package[0], "validation")) > 0
    assert all(e.image and e.question and len(e.audio) > 44 for e in examples)  # a WAV with samples
    assert len(split_examples(package, root, "validation", limit=3)) == 3


def test_the_fitted_temperature_lowers_the_nll(fitted, validation):
    logits, labels = validation
    assert fitted.examples == len(labels)
    assert fitted.nll["fitted"] <= fitted.nll["temperature_1"]
    assert fitted.nll["fitted"] == pytest.approx(nll(logits, labels, fitted.temperature))
    for other in (0.5 * fitted.temperature, 2.0 * fitted.temperature):  # a minimum, not just an improvement
        assert nll(logits, labels, other) >= fitted.nll["fitted"] - 1e-9


def test_temperature_search_recovers_a_known_overconfidence():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 2, (4000, 8))
    probabilities = softmax(true_logits)
    labels = np.array([rng.choice(8, p=p) for p in probabilities])
    assert fit_temperature(3.0 * true_logits, labels) == pytest.approx(3.0, rel=0.1)


def test_the_threshold_gives_the_target_cloud_rate_within_one_question(fitted, validation):
    logits, _ = validation
    confidences = softmax(logits, fitted.temperature).max(axis=1)
    n = len(confidences)
    sent = int((confidences < fitted.threshold).sum())
    assert abs(sent - 0.3 * n) <= 1
    assert fitted.chosen["cloud_rate"] == pytest.approx(sent / n)
    for rate in (0.0, 0.1, 0.5, 0.77, 1.0):
        threshold = threshold_for_cloud_rate(confidences, rate)
        assert abs((confidences < threshold).sum() - rate * n) <= 1


def test_the_curve_is_monotone_where_it_must_be(fitted):
    curve = fitted.curve
    thresholds = [row["threshold"] for row in curve]
    rates = [row["cloud_rate"] for row in curve]
    overall = [row["accuracy"] for row in curve]
    assert thresholds == sorted(thresholds) and len(set(thresholds)) == len(thresholds)
    assert all(a < b for a, b in zip(rates, rates[1:]))  # each threshold sends more questions to the cloud
    assert all(a <= b + 1e-12 for a, b in zip(overall, overall[1:]))  # the cloud is assumed right (accuracy 1)
    assert (rates[0], rates[-1]) == (0.0, 1.0)
    assert curve[0]["accuracy"] == pytest.approx(curve[0]["edge_accuracy"])  # nothing sent: the edge alone
    assert (curve[-1]["accuracy"], curve[-1]["edge_accuracy"]) == (1.0, None)
    assert all(0 <= row["accuracy"] <= 1 for row in curve)


def test_a_target_accuracy_picks_the_lowest_cloud_rate_reaching_it(pipeline, package, root, fitted):
    target = (fitted.curve[0]["accuracy"] + 1.0) / 2
    by_accuracy = calibrate(package, root, target_accuracy=target, cloud_accuracy=0.9, pipeline=pipeline)
    chosen = by_accuracy.chosen
    assert chosen["accuracy"] >= target
    assert not [row for row in by_accuracy.curve
                if row["accuracy"] >= target and row["cloud_rate"] < chosen["cloud_rate"]]
    assert by_accuracy.cloud == {"accuracy": 0.9, "measured": False}
    assert by_accuracy.latency["edge_ms"] > 0 and by_accuracy.latency["cloud_ms"] is None  # the cloud is not asked
    with pytest.raises(CalibrationError, match="no threshold reaches it"):
        threshold_for_accuracy(by_accuracy.curve, 0.999)  # a cloud right 90% of the time cannot lift it there


def test_the_cloud_accuracy_can_be_measured_by_asking_the_server(pipeline, package, root, live_server):
    measured = calibrate(package, root, target_cloud_rate=0.5, cloud=live_server.rest_url, pipeline=pipeline)
    assert measured.cloud["measured"] and measured.cloud["failed"] == 0
    assert measured.latency["cloud_ms"] > 0 and measured.latency["edge_ms"] > 0  # one question alone, each side
    # the server runs the same model: every answer it gives is the device's, so the cloud changes nothing
    edge_alone = measured.curve[0]["accuracy"]
    assert measured.cloud["accuracy"] == pytest.approx(edge_alone)
    assert all(row["accuracy"] == pytest.approx(edge_alone) for row in measured.curve)


def test_bad_settings_and_data_give_clear_errors(pipeline, package, root, validation):
    for rate in (1.5, -0.1):
        with pytest.raises(CalibrationError, match=r"target cloud rate .*expected a number in \[0, 1\]"):
            calibrate(package, root, target_cloud_rate=rate, pipeline=pipeline)
    with pytest.raises(CalibrationError, match="one target"):
        calibrate(package, root, target_cloud_rate=0.2, target_accuracy=0.9, pipeline=pipeline)
    with pytest.raises(CalibrationError, match="cloud accuracy 2"):
        calibrate(package, root, cloud_accuracy=2, pipeline=pipeline)
    with pytest.raises(CalibrationError, match="split 'holdout'"):
        calibrate(package, root, split="holdout", pipeline=pipeline)
    with pytest.raises(CalibrationError, match="N > 0"):
        fit_temperature(np.zeros((0, 13)), np.zeros((0,), np.int64))
    assert accuracy_curve([], [], 1.0) == []
    examples = split_examples(package, root, "validation", limit=3)
    corrupt = [e.__class__(b"broken", e.question, e.audio, e.answer) for e in examples]
    with pytest.raises(CalibrationError, match=r"no usable questions: 3 given, 3 failed \(first: item 0: image"):
        edge_logits(pipeline, corrupt, "typed")
    # one bad question among good ones is skipped and reported, never fatal
    logits, labels, skipped, kept = edge_logits(pipeline, [examples[0], corrupt[1], examples[2]], "typed")
    assert len(labels) == 2 and len(skipped) == 1 and skipped[0].startswith("item 1: image")


def test_calibrate_cli_writes_a_file_the_cascade_loads(package, root, pipeline, tmp_path, capsys):
    out = tmp_path / "calibration.json"
    assert main(["lite", "calibrate", str(package), "--data", str(root), "--target-cloud-rate", "0.3",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "temperature" in printed and "cloud rate" in printed and "overall acc." in printed
    assert str(out) in printed
    calibration = load_calibration(out)
    assert calibration.target == {"cloud_rate": 0.3} and calibration.split == "validation"
    assert json.loads(out.read_text())["curve"] == calibration.curve
    cascade = Cascade.from_calibration(out, pipeline, "http://127.0.0.1:9")
    assert (cascade.threshold, cascade.temperature) == (calibration.threshold, calibration.temperature)


def test_calibrate_cli_writes_beside_the_manifest_by_default(package, root, writable_copy, tmp_path, capsys):
    copy = writable_copy(package, tmp_path)
    assert main(["lite", "calibrate", str(copy), "--data", str(root), "--split", "test", "--limit", "20",
                 "--target-accuracy", "0.5", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == str(copy / CALIBRATION_FILE) and printed["examples"] == 20
    assert load_calibration(copy).threshold == printed["threshold"]


def test_calibrate_cli_refuses_bad_input_with_the_reason(package, root, tmp_path, capsys):
    assert main(["lite", "calibrate", str(package), "--data", str(root), "--target-cloud-rate", "1.5",
                 "--out", str(tmp_path / "c.json")]) == 2
    assert "target cloud rate 1.5: expected a number in [0, 1]" in capsys.readouterr().err
    assert main(["lite", "calibrate", str(package), "--data", str(tmp_path / "nothing"), "--split", "test",
                 "--out", str(tmp_path / "c.json")]) == 2
    assert str(tmp_path / "nothing") in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()
