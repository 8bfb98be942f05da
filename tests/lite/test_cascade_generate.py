"""The edge-cloud cascade with a generative package at the edge: a confident generated answer stays on the device,
an unsure one is asked of a live `mindvl serve` of the same package and its tokens stream back as Server-Sent
Events (the same greedy tokens: the same graphs), and a cloud that cannot be reached leaves the device's answer."""
import numpy as np
import pytest

from mindvl.data.reading.examples import query_examples
from mindvl.lite.calibration import Calibration, CalibrationError
from mindvl.lite.cascade import Cascade
from mindvl.lite.device import DevicePipeline
from mindvl.lite.lite_model import LiteError

SETTINGS = {"max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def cloud(generative_server):
    """The session's live server of the same package (servable `vlm`)."""
    return generative_server


@pytest.fixture(scope="module")
def edge(generative_package):
    with DevicePipeline(generative_package[1], backend="graphcell") as device:
        yield device


@pytest.fixture(scope="module")
def question(generative_package):
    example = query_examples(generative_package[0].data.root, 1)[0]
    return {"image": example.image, "question": example.question}


def test_a_confident_answer_stays_on_the_device(edge, cloud, question):
    expected = edge.generate(**question, **SETTINGS)
    with Cascade(edge, cloud.rest_url, threshold=0.0, servable="vlm") as cascade:
        answer = cascade.generate(**question, **SETTINGS)
        assert answer.source == "edge" and answer.tokens == expected.tokens and answer.text == expected.text
        assert answer.confidence == pytest.approx(float(np.exp(np.mean(expected.logprobs))))
        assert 0 < answer.confidence <= 1 and answer.edge_text == expected.text and answer.cloud_error is None
        assert cascade.counts == {"edge": 1, "cloud": 0, "edge_fallback": 0}


def test_an_unsure_answer_streams_the_clouds_tokens(edge, cloud, question):
    expected = edge.generate(**question, **SETTINGS)
    with Cascade(edge, cloud.rest_url, threshold=2.0, servable="vlm") as cascade:
        deltas = list(cascade.stream(**question, **SETTINGS))
        assert [d.source for d in deltas] == ["cloud"] * len(expected.tokens)
        assert [d.token for d in deltas] == expected.tokens  # the same package's graphs, greedy
        assert "".join(d.text for d in deltas) == expected.text and deltas[-1].finish == "length"
        np.testing.assert_allclose([d.logprob for d in deltas], expected.logprobs, atol=1e-4, rtol=0)
        answer = cascade.generate(**question, **SETTINGS)
        assert answer.source == "cloud" and answer.tokens == expected.tokens and answer.edge_text == expected.text
        assert cascade.counts == {"edge": 0, "cloud": 2, "edge_fallback": 0}


def test_an_unreachable_cloud_leaves_the_devices_answer(edge, question):
    expected = edge.generate(**question, **SETTINGS)
    with Cascade(edge, "http://127.0.0.1:9", threshold=2.0, timeout_s=5, servable="vlm") as cascade:
        answer = cascade.generate(**question, **SETTINGS)
    assert answer.source == "edge_fallback" and answer.tokens == expected.tokens and answer.text == expected.text
    assert "cannot reach http://127.0.0.1:9" in answer.cloud_error


def test_a_setting_the_cloud_does_not_take_and_a_vqa_calibration_are_refused(edge, tmp_path):
    with Cascade(edge, "http://127.0.0.1:9", servable="vlm") as cascade:
        with pytest.raises(LiteError, match="stop_tokens: the cloud's generate takes no such setting"):
            cascade.generate(question="what?", stop_tokens=[3])
        with pytest.raises(LiteError, match="generative package answers in words"):
            cascade.answer(b"png", "what?")
    calibration = Calibration(temperature=1.5, threshold=0.5, package={"name": "tiny", "vqa_sha256": "0" * 64})
    with pytest.raises(CalibrationError, match="fitted for package tiny v.* \\(vqa sha256 000000000000\\), not .* decode "
                                               "sha256"):
        Cascade.from_calibration(calibration.save(tmp_path / "c.json"), edge, "http://127.0.0.1:9")


def test_calibrate_fits_the_threshold_of_generated_answers_on_their_confidence(generative_package, edge, cloud):
    """`mindvl lite calibrate` of a generative package: each answer's confidence is exp(mean token log-probability),
    right or wrong after the evaluation's normalisation; the cloud (a live generate) measured on the same
    questions; the calibrated cascade loads for the package and routes by that threshold."""
    from mindvl.deploy.calibrate import calibrate

    cfg, package = generative_package
    calibration = calibrate(package, cfg.data.root, split="test", limit=6, target_cloud_rate=0.5, pipeline=edge,
                            cloud=cloud.rest_url, servable="vlm")
    assert calibration.examples == 6 and calibration.temperature == 1.0 and calibration.nll == {}
    assert calibration.cloud["measured"] and calibration.cloud["failed"] == 0
    assert 0 < calibration.chosen["cloud_rate"] < 1 and 0 < calibration.threshold <= 1
    assert "decode_sha256" in calibration.package
    with Cascade.from_calibration(calibration.save(package.parent / "calibration_test.json"), edge, cloud.rest_url,
                                  servable="vlm") as cascade:
        assert cascade.threshold == calibration.threshold


def test_ask_takes_an_instance_as_a_rest_client_sends_it(edge, cloud, question):
    """`Cascade.ask` (the demo page's POST /cascade): generate's inputs in, the answer and its source out."""
    expected = edge.generate(**question, max_new_tokens=8)
    with Cascade(edge, cloud.rest_url, threshold=2.0, servable="vlm") as cascade:
        assert cascade.describe() == {"edge": "vlm", "method": "generate", "servable": "vlm", "threshold": 2.0}
        answer = cascade.ask({"image": question["image"], "text": question["question"], "max_tokens": 8})
        assert answer["source"] == "cloud" and answer["text"] == expected.text == answer["edge_text"]
        assert answer["confidence"] == pytest.approx(float(np.exp(np.mean(expected.logprobs))))
        with pytest.raises(ValueError, match="input 'question': the cascade's generate takes image, text, audio, "
                                             "max_tokens"):
            cascade.ask({"image": question["image"], "question": "what?"})
