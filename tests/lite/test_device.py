"""DevicePipeline on the session's small package: the device answers what the server answers for the same
request bytes, its logits match the package's GraphCell graph on the same inputs, each modality is
preprocessed on its own thread, and a bad item in a batch is named and skipped."""
import json

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.data.reading.examples import query_examples, wav_bytes
from mindvl.errors import InputError
from mindvl.lite.calibration import example_item
from mindvl.lite.device import MODALITIES, DevicePipeline
from mindvl.package_reader import TOLERANCE, load_graph, read_manifest
from mindvl.serving import Client

MODES = ("typed", "spoken", "both")
# lite2 graph vs the server's GraphCell: the package's own verification tolerance on logits; confidences are
# softmax probabilities in [0, 1] of those logits, so they agree to the same absolute tolerance
ATOL, RTOL = TOLERANCE["atol"], TOLERANCE["rtol"]


@pytest.fixture(scope="module")
def examples(vqa_package):
    return query_examples(vqa_package[0].data.root, 4)


@pytest.fixture(scope="module")
def pipeline(package):
    with DevicePipeline(package) as device:
        yield device


def test_device_answers_equal_the_servers_for_typed_spoken_and_both(pipeline, examples, live_server):
    items = [example_item(e, mode) for e in examples for mode in MODES]
    served = Client(live_server.rest_url, "vqa", "predict").infer(items)
    for item, server, device in zip(items, served, pipeline.answer_batch(items)):
        assert "error" not in server, server
        assert device.answer == server["answer"] and device.answer_text == server["answer_text"]
        assert device.confidence == pytest.approx(float(server["confidence"]), abs=ATOL)
        single = pipeline.answer(item["image"], item["question"], item["audio"])
        assert single.answer == device.answer
        np.testing.assert_allclose(single.logits, device.logits, atol=ATOL, rtol=RTOL)


def test_device_logits_match_the_graphcell_graph_on_the_same_inputs(pipeline, package, examples):
    rows = [pipeline.prepare(**example_item(e, mode))[0] for e in examples for mode in MODES]
    logits, answer_ids = pipeline.predict(rows)
    graph = load_graph(package, read_manifest(package), "vqa")
    import mindspore as ms

    expected = graph(*(ms.Tensor(np.stack([row[name] for row in rows])) for name in pipeline.input_names))
    np.testing.assert_allclose(logits, expected[0].asnumpy(), atol=ATOL, rtol=RTOL)
    np.testing.assert_array_equal(answer_ids, expected[1].asnumpy())


def test_the_graphcell_backend_answers_like_the_default_one(package, pipeline, examples):
    items = [example_item(e, mode) for e in examples[:2] for mode in MODES]
    with DevicePipeline(package, backend="graphcell") as cell:
        assert cell.backend == "graphcell"
        for ours, theirs in zip(pipeline.answer_batch(items), cell.answer_batch(items)):
            assert ours.answer == theirs.answer
            np.testing.assert_allclose(ours.logits, theirs.logits, atol=ATOL, rtol=RTOL)


def test_the_three_modalities_are_preprocessed_on_three_threads(pipeline, examples):
    import threading

    answer = pipeline.answer(**example_item(examples[0], "both"))
    assert set(answer.threads) == set(MODALITIES)
    assert len(set(answer.threads.values())) == 3
    assert threading.current_thread().name not in answer.threads.values()
    for modality, thread in answer.threads.items():
        assert thread.startswith(f"mindvl-{modality}")
    batch = pipeline.answer_batch([example_item(e, "both") for e in examples])
    assert all(a.threads[m].startswith(f"mindvl-{m}") for a in batch for m in MODALITIES)


def test_timings_name_every_stage(pipeline, examples):
    timings = pipeline.answer(**example_item(examples[1], "both")).timings
    assert set(timings) == {*MODALITIES, "preprocess", "model", "total"}
    assert all(seconds >= 0 for seconds in timings.values())
    assert timings["preprocess"] >= max(timings[m] for m in MODALITIES)
    assert timings["total"] >= timings["preprocess"] + timings["model"] - 1e-6


def test_a_batch_names_and_skips_bad_items_and_answers_the_rest(pipeline, examples):
    good = example_item(examples[0], "both")
    empty_wav = wav_bytes(b"", 16000)
    items = [good, {**good, "image": b"\x89PNG not really"}, {**good, "question": "", "audio": empty_wav},
             {**good, "question": "", "audio": b""}, {**good, "question": 7}, good]
    results = pipeline.answer_batch(items)
    errors = {i: str(r) for i, r in enumerate(results) if isinstance(r, InputError)}
    assert sorted(errors) == [1, 2, 3, 4]
    assert errors[1].startswith("item 1: image: cannot decode the image")
    assert errors[2].startswith("item 2: audio:") and "empty" in errors[2]
    assert errors[3].startswith("item 3: predict: question and audio are both empty")
    assert errors[4].startswith("item 4: question: expected str")
    single = pipeline.answer(**good)
    for answer in (results[0], results[5]):
        assert answer.answer == single.answer
        np.testing.assert_allclose(answer.logits, single.logits, atol=ATOL, rtol=RTOL)


def test_a_single_bad_input_raises_input_error_naming_it(pipeline, examples):
    with pytest.raises(InputError, match=r"^image: cannot decode the image"):
        pipeline.answer(b"not an image", "what shape is it?")
    with pytest.raises(InputError, match=r"^audio: cannot read the audio"):
        pipeline.answer(examples[0].image, "", b"RIFF\x00\x00garbage")


def test_from_model_finds_the_package_of_a_lite_model(package, examples, pipeline):
    from mindvl.lite.lite_model import LiteModel

    with DevicePipeline.from_model(LiteModel.from_package(package, "vqa", backend=pipeline.backend)) as device:
        assert device.package == package.resolve()
        assert device.answer(**example_item(examples[0], "typed")).answer == \
            pipeline.answer(**example_item(examples[0], "typed")).answer


def test_ask_cli_answers_on_the_device(package, pipeline, examples, tmp_path, capsys):
    (tmp_path / "image.png").write_bytes(examples[2].image)
    (tmp_path / "question.wav").write_bytes(examples[2].audio)
    code = main(["lite", "ask", str(package), "--image", str(tmp_path / "image.png"), "--audio",
                 str(tmp_path / "question.wav"), "--repeat", "2", "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    expected = pipeline.answer(examples[2].image, "", examples[2].audio)
    assert printed["answer"] == expected.answer and printed["source"] == "edge"
    assert printed["confidence"] == pytest.approx(expected.confidence, abs=ATOL)
    assert set(printed["warm_timings"]) == {*MODALITIES, "preprocess", "model", "total"}

    code = main(["lite", "ask", str(package), "--image", str(tmp_path / "missing.png"), "--question", "what?"])
    assert code == 2
    assert "--image" in capsys.readouterr().err
