"""The edge-cloud cascade with the session's small package on the device and a real `mindvl serve` as the
cloud: threshold 0 keeps every question on the device, a threshold above 1 sends every one to the cloud and
returns the server's answers, and a cloud on a closed port or one that never replies gives the device's
answer flagged "edge_fallback" with the reason."""
import json
import socket
import time

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.data.reading.examples import query_examples
from mindvl.errors import InputError
from mindvl.lite.calibration import Calibration, CalibrationError, example_item, package_identity
from mindvl.lite.cascade import Cascade
from mindvl.lite.device import DevicePipeline, softmax
from mindvl.lite.lite_model import LiteError
from mindvl.serving import Client


@pytest.fixture(scope="module")
def items(vqa_package):
    examples = query_examples(vqa_package[0].data.root, 6)
    return [example_item(e, mode) for e, mode in zip(examples, ("typed", "spoken", "both") * 2)]


@pytest.fixture(scope="module")
def pipeline(package):
    with DevicePipeline(package) as device:
        yield device


@pytest.fixture(scope="module")
def server_answers(live_server, items):
    return Client(live_server.rest_url, "vqa", "predict").infer(items)


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return port


def test_threshold_0_answers_everything_on_the_edge(pipeline, live_server, items):
    cascade = Cascade(pipeline, live_server.rest_url, threshold=0.0)
    results = cascade.answer_batch(items)
    device = pipeline.answer_batch(items)
    assert [r.source for r in results] == ["edge"] * len(items)
    assert [r.answer for r in results] == [d.answer for d in device]
    assert all(r.cloud_error is None and "cloud" not in r.timings for r in results)
    assert cascade.counts == {"edge": len(items), "cloud": 0, "edge_fallback": 0}


def test_threshold_above_1_sends_everything_to_the_cloud_and_returns_its_answers(pipeline, live_server, items,
                                                                                 server_answers):
    cascade = Cascade(pipeline, Client(live_server.rest_url, "vqa", "predict"), threshold=1.01)
    results = cascade.answer_batch(items)
    assert [r.source for r in results] == ["cloud"] * len(items)
    for result, served in zip(results, server_answers):
        assert result.answer == served["answer"]
        assert result.confidence == pytest.approx(float(served["confidence"]), abs=1e-6)
        assert result.timings["cloud"] > 0
    one = cascade.answer(**items[0])
    assert (one.source, one.answer) == ("cloud", server_answers[0]["answer"])


def test_the_calibrated_confidence_decides_per_question(pipeline, live_server, items, server_answers):
    temperature = 0.5
    confidences = [float(softmax(a.logits, temperature).max()) for a in pipeline.answer_batch(items)]
    threshold = float(np.median(confidences))
    cascade = Cascade(pipeline, live_server.rest_url, threshold=threshold, temperature=temperature)
    for result, confidence, served in zip(cascade.answer_batch(items), confidences, server_answers):
        assert result.edge_confidence == pytest.approx(confidence, abs=1e-9)
        assert result.source == ("edge" if confidence >= threshold else "cloud")
        if result.source == "cloud":
            assert result.answer == served["answer"]
        else:
            assert (result.answer, result.confidence) == (result.edge_answer, result.edge_confidence)


def test_a_cloud_on_a_closed_port_gives_the_edge_answer_flagged_as_fallback(pipeline, items, closed_port):
    cascade = Cascade(pipeline, f"http://127.0.0.1:{closed_port}", threshold=2.0)
    device = pipeline.answer_batch(items[:2])
    results = cascade.answer_batch(items[:2])
    for result, edge in zip(results, device):
        assert result.source == "edge_fallback"
        assert (result.answer, result.edge_answer) == (edge.answer, edge.answer)
        assert result.confidence == pytest.approx(edge.confidence, abs=1e-6)  # temperature 1: the raw softmax
        assert "cannot reach" in result.cloud_error and str(closed_port) in result.cloud_error
    assert cascade.counts["edge_fallback"] == 2


def test_a_cloud_that_never_replies_times_out_into_the_edge_answer(pipeline, items):
    with socket.socket() as silent:  # accepts connections (the backlog) and reads nothing: a hung endpoint
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        cascade = Cascade(pipeline, f"http://127.0.0.1:{silent.getsockname()[1]}", threshold=2.0, timeout_s=0.5)
        start = time.perf_counter()
        result = cascade.answer(**items[0])
        elapsed = time.perf_counter() - start
        cascade.close()
    assert result.source == "edge_fallback" and result.answer == pipeline.answer(**items[0]).answer
    assert "did not answer within 0.5 s" in result.cloud_error
    assert elapsed < 5


def test_a_cloud_that_refuses_the_request_gives_the_fallback_with_its_message(pipeline, live_server, items):
    refusing = Client(live_server.rest_url, "nosuch", "predict")
    results = Cascade(pipeline, refusing, threshold=2.0).answer_batch(items[:2])
    assert [r.source for r in results] == ["edge_fallback"] * 2
    assert all(r.cloud_error.startswith("ServingError:") and "nosuch" in r.cloud_error for r in results)


def test_a_question_the_device_refuses_is_named_in_its_place_and_never_sent(pipeline, live_server, items):
    too_long = {**items[0], "question": "x " * 40}  # more tokens than preprocess.max_text_length
    cascade = Cascade(pipeline, live_server.rest_url, threshold=2.0)
    results = cascade.answer_batch([items[1], too_long])
    assert results[0].source == "cloud"
    assert isinstance(results[1], InputError) and str(results[1]).startswith("item 1: question:")
    assert cascade.counts == {"edge": 0, "cloud": 1, "edge_fallback": 0}
    with pytest.raises(InputError, match="^question:"):
        cascade.answer(**too_long)


def test_an_edge_lite_model_or_package_folder_works_like_a_pipeline(package, pipeline, live_server, items):
    from mindvl.lite.lite_model import LiteModel

    expected = pipeline.answer(**items[0]).answer
    with Cascade(LiteModel.from_package(package, "vqa", backend=pipeline.backend), live_server.rest_url,
                 threshold=0.0) as cascade:
        assert cascade.answer(**items[0]).answer == expected
    with Cascade(package, live_server.rest_url, threshold=0.0) as cascade:
        assert cascade.answer(**items[0]).answer == expected
    with pytest.raises(LiteError, match="threshold"):
        Cascade(pipeline, live_server.rest_url, threshold=-0.1)
    with pytest.raises(LiteError, match="temperature"):
        Cascade(pipeline, live_server.rest_url, temperature=0)


def test_from_calibration_uses_the_fitted_values_and_refuses_another_packages(pipeline, package, live_server,
                                                                              tmp_path):
    identity = package_identity(pipeline.manifest)
    path = Calibration(temperature=1.7, threshold=0.42, package=identity).save(tmp_path / "calibration.json")
    cascade = Cascade.from_calibration(path, pipeline, live_server.rest_url)
    assert (cascade.temperature, cascade.threshold) == (1.7, 0.42)
    assert Cascade.from_calibration(path, pipeline, live_server.rest_url, threshold=0.9).threshold == 0.9
    other = Calibration(temperature=1.7, threshold=0.42, package={**identity, "vqa_sha256": "0" * 64})
    with pytest.raises(CalibrationError, match="fitted for package"):
        Cascade.from_calibration(other.save(tmp_path / "other.json"), pipeline, live_server.rest_url)
    with pytest.raises(CalibrationError, match="no such calibration file"):
        Cascade.from_calibration(tmp_path / "missing.json", pipeline, live_server.rest_url)


def test_ask_cli_goes_through_the_cascade(package, live_server, items, server_answers, tmp_path, capsys,
                                          closed_port):
    (tmp_path / "image.png").write_bytes(items[0]["image"])
    base = ["lite", "ask", str(package), "--image", str(tmp_path / "image.png"), "--question", items[0]["question"]]
    assert main([*base, "--cloud", live_server.rest_url, "--threshold", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["source"], printed["answer"]) == ("cloud", server_answers[0]["answer"])

    assert main([*base, "--cloud", f"http://127.0.0.1:{closed_port}", "--threshold", "2"]) == 0
    out = capsys.readouterr().out
    assert "source edge_fallback" in out and "cloud error: ServingError: cannot reach" in out
