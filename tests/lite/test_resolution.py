"""Test-time resolution search on the session's small package: the views are what they claim (the full view
is the server's preprocessing; on the 4x canvas copy the quarter crop is the original image again), the rules
combine as documented, and the report on a resized copy of test questions is complete and consistent."""
import json

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.data.reading.examples import query_examples
from mindvl.deploy.resolution_search import resize_encoded, resized_copy, resolution_report
from mindvl.lite.device import DevicePipeline
from mindvl.lite.lite_model import LiteError
from mindvl.lite.resolution import DEFAULT_VIEWS, RULES, ResolutionSearch, combine, parse_view
from mindvl.preprocess import decode_image, open_image


@pytest.fixture(scope="module")
def examples(root):
    return query_examples(root, 6)


@pytest.fixture(scope="module")
def pipeline(package):
    with DevicePipeline(package) as device:
        yield device


def test_the_canvas_copy_keeps_the_scene_at_its_pixel_size(examples):
    original = open_image(examples[0].image)
    copy = open_image(resize_encoded(examples[0].image, 4, "canvas"))
    width, height = original.size
    assert copy.size == (4 * width, 4 * height)
    left, top = (4 * width - width) // 2, (4 * height - height) // 2
    np.testing.assert_array_equal(np.asarray(copy)[top:top + height, left:left + width], np.asarray(original))
    assert open_image(resize_encoded(examples[0].image, 4, "upscale")).size == (4 * width, 4 * height)
    copies = resized_copy(examples, 4)
    assert [c.question for c in copies] == [e.question for e in examples]
    assert all(open_image(c.image).size == (4 * width, 4 * height) for c in copies)


def test_views_are_the_servers_pixels_and_the_quarter_crop_undoes_the_canvas(pipeline, examples):
    search = ResolutionSearch(pipeline, ["full", "crop:0.25", "pad:0.5"])
    original = examples[0].image
    views = search.view_arrays(original)
    assert views.shape == (3, 3, pipeline.pre.image_size, pipeline.pre.image_size) and views.dtype == np.float32
    np.testing.assert_array_equal(views[0], decode_image(original, pipeline.pre))
    on_canvas = search.view_arrays(resize_encoded(original, 4, "canvas"))
    np.testing.assert_array_equal(on_canvas[1], views[0])


def test_the_rules_combine_as_documented():
    probabilities = np.array([[0.6, 0.3, 0.1],   # view 0 says 0
                              [0.2, 0.7, 0.1],   # view 1 says 1
                              [0.1, 0.8, 0.1],   # view 2 says 1
                              [0.95, 0.04, 0.01]])  # view 3 says 0, very sure
    assert combine(probabilities, "vote") == (0, pytest.approx(0.775))  # 2 votes each: 0.6 + 0.95 beats 0.7 + 0.8
    assert combine(probabilities[:3], "vote") == (1, pytest.approx(0.75))  # 2 votes to 1
    assert combine(probabilities, "max") == (0, pytest.approx(0.95))
    assert combine(probabilities, "mean")[0] == int(probabilities.mean(axis=0).argmax())
    with pytest.raises(LiteError, match="rule 'median'"):
        combine(probabilities, "median")


def test_views_and_settings_are_checked():
    assert parse_view("full") == ("crop", 1.0) and parse_view("pad:0.5") == ("pad", 0.5)
    for bad in ("zoom:2", "crop:0", "crop:1.5", "pad:", "crop"):
        with pytest.raises(LiteError, match="expected full, crop:F or pad:F"):
            parse_view(bad)
    with pytest.raises(LiteError, match="mode 'stretch'"):
        resize_encoded(b"", 4, "stretch")
    with pytest.raises(LiteError, match="scale 0"):
        resize_encoded(b"", 0)


def test_a_search_answer_reports_every_view(pipeline, examples):
    search = ResolutionSearch(pipeline, DEFAULT_VIEWS, rule="max")
    example = examples[1]
    answer = search.answer(example.image, example.question)
    assert [spec for spec, _, _ in answer.views] == list(DEFAULT_VIEWS)
    assert answer.answer in pipeline.labels and answer.rule == "max"
    assert answer.confidence == pytest.approx(max(confidence for _, _, confidence in answer.views))
    plain = pipeline.answer(example.image, example.question)
    assert answer.views[0][1] == plain.answer
    assert answer.views[0][2] == pytest.approx(plain.confidence, abs=1e-6)


def test_the_report_on_a_resized_copy_is_complete_and_consistent(pipeline, package, root):
    report = resolution_report(package, root, scale=4, limit=6, views=["full", "crop:0.5", "crop:0.25"],
                               pipeline=pipeline)
    original, copy = report["data"]
    assert (original["name"], copy["name"]) == ("original", "canvas x4")
    width, height = open_image(query_examples(root, 1)[0].image).size
    assert (original["size"], copy["size"]) == (f"{width}x{height}", f"{4 * width}x{4 * height}")
    for data in report["data"]:
        assert data["questions"] == 6 and data["skipped"] == []
        assert set(data["accuracy"]) == {"plain", *RULES, "full", "crop:0.5", "crop:0.25"}
        assert all(0 <= value <= 1 for value in data["accuracy"].values())
        assert data["accuracy"]["plain"] == data["accuracy"]["full"]
    # the quarter crop of the canvas copy is the original image: same answers, same accuracy
    assert copy["accuracy"]["crop:0.25"] == original["accuracy"]["full"]


def test_bad_items_are_skipped_and_counted(pipeline, examples):
    broken = [examples[0], examples[1].__class__(b"broken", examples[1].question, examples[1].audio,
                                                 examples[1].answer), examples[2]]
    result = ResolutionSearch(pipeline).evaluate(broken)
    assert result["questions"] == 2
    assert len(result["skipped"]) == 1 and result["skipped"][0].startswith("item 1: image: cannot decode")


def test_resolution_cli_prints_the_comparison(package, root, capsys):
    assert main(["lite", "resolution", str(package), "--data", str(root), "--limit", "4", "--scale", "3",
                 "--views", "full,crop:0.34"]) == 0
    out = capsys.readouterr().out
    assert "canvas x3" in out and "vote" in out and "crop:0.34" in out
    assert main(["lite", "resolution", str(package), "--data", str(root), "--limit", "4", "--mode", "upscale",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["data"][1]["name"] == "upscale x4" and report["views"] == list(DEFAULT_VIEWS)
    assert main(["lite", "resolution", str(package), "--data", str(root), "--views", "zoom:2"]) == 2
    assert "view 'zoom:2'" in capsys.readouterr().err
