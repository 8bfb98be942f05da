"""The C++ on-device runner (lite/runner, `mindvl_runner`), built with CMake against the Lite 2.0 wheel and
run on the session's package: its answers match GraphCell and the Lite 2.0 runtime on the same inputs,
its preprocessing (libpng / libjpeg, bicubic resize, tokeniser) matches mindvl.preprocess, and bad inputs
end with exit code 2 and a message naming them. Skipped only when the runner cannot be built here."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mindvl import preprocess as P
from mindvl.config import PreprocessConfig
from mindvl.lite.cpp_runner import RunnerFailed, run_runner
from mindvl.lite.lite_model import LiteModel
from mindvl.package_reader import read_manifest

# Measured on the session's package (and a second small one): the runner's image tensor equals
# decode_image's bit for bit (PNG and JPEG, resized or not), so preprocessing adds nothing; its logits
# equal the Lite 2.0 runtime's through the bridge exactly, and GraphCell's within 7.5e-6.
LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module")
def pipeline(package):
    """(PreprocessConfig, TextTokenizer, labels) of the package, as the server reads them."""
    manifest = read_manifest(package)
    recorded = manifest["preprocess"]
    pre = PreprocessConfig(**{f.name: recorded[f.name] for f in dataclasses.fields(PreprocessConfig)})
    return pre, P.TextTokenizer.load(package / recorded["tokenizer"]), list(manifest["labels"])


@pytest.fixture(scope="module")
def questions():
    """Three real easy-VQA test questions with their image files."""
    import easy_vqa

    texts, _, image_ids = easy_vqa.get_test_questions()  # (questions, answers, image ids)
    paths = easy_vqa.get_test_image_paths()
    return [(paths[image_ids[i]], texts[i]) for i in (0, 1, 2)]


@pytest.fixture(scope="module")
def images(questions, pipeline, tmp_path_factory):
    """name -> an image file that exercises one decoder or resize path, made from a real test image."""
    size = pipeline[0].image_size
    folder = tmp_path_factory.mktemp("runner_images")
    photo = Image.open(questions[0][0]).convert("RGB")
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (71, 97, 3), np.uint8))  # hard to resize
    made = {
        "native.png": photo.resize((size, size)),
        "larger.png": photo.resize((size + 36, size + 36)),
        "odd.png": photo.resize((37, 53)),
        "wide.png": photo.resize((3 * size, size)),
        "noise.png": noise,
        "rgba.png": noise.convert("RGBA"),
        "palette.png": noise.convert("P", palette=Image.ADAPTIVE, colors=16),
        "grey.png": noise.convert("L"),
        "grey16.png": Image.fromarray(np.random.default_rng(1).integers(0, 65536, (40, 30)).astype(np.uint16)),
        "photo.jpg": photo.resize((80, 60)),
        "noise.jpg": noise,
        "grey.jpg": noise.convert("L"),
    }
    for name, image in made.items():
        image.save(folder / name, **({"quality": 85} if name.endswith(".jpg") else {}))
    return {name: folder / name for name in made}


def python_inputs(pre, tokenizer, image_path, question):
    """The vqa graph's inputs for a typed question, as the server's stages build them (no audio)."""
    ids, mask = tokenizer.encode(question, pre.max_text_length, "question")
    return {"image": P.decode_image(Path(image_path).read_bytes(), pre)[None],
            "question_ids": ids[None], "question_mask": mask[None],
            "audio_mel": np.zeros((1, pre.n_mels, pre.max_audio_frames), np.float32),
            "audio_mask": np.zeros((1, pre.max_audio_frames), np.float32),
            "use_text": np.ones((1,), np.float32), "use_audio": np.zeros((1,), np.float32)}


def top_probability(logits) -> float:
    weights = np.exp(np.asarray(logits, np.float64) - np.max(logits))
    return float(weights.max() / weights.sum())


def test_runner_answers_as_graphcell_and_lite2_do(runner, package, pipeline, questions, images):
    pre, tokenizer, labels = pipeline
    cases = [*questions, (images["odd.png"], questions[0][1])]  # the last one is resized on both sides
    with LiteModel.from_package(package, "vqa", backend="graphcell") as graphcell, \
            LiteModel.from_package(package, "vqa", backend="lite2") as lite2:
        for image, question in cases:
            feeds = python_inputs(pre, tokenizer, image, question)
            expected = graphcell.run(feeds)
            on_lite2 = lite2.run(feeds)
            result = run_runner(package, image, question)
            logits = np.asarray(result["logits"], np.float32)
            np.testing.assert_allclose(logits, expected["answer_logits"][0], rtol=0, atol=LOGITS_ATOL)
            np.testing.assert_allclose(logits, on_lite2["answer_logits"][0], rtol=0, atol=LOGITS_ATOL)
            assert result["answer"] == labels[int(expected["answer_logits"][0].argmax())]
            assert result["answer_ids"] == expected["answer_ids"][0].tolist()
            assert result["confidence"] == pytest.approx(top_probability(expected["answer_logits"][0]), abs=1e-5)
            assert result["build_ms"] > 0 and result["predict_ms"] > 0 and result["preprocess_ms"] > 0
    # more threads, same answer: the lite2 graphs have no LayerNorm kernel to go wrong
    on_two = run_runner(package, *cases[0], threads=2)
    np.testing.assert_allclose(on_two["logits"], run_runner(package, *cases[0])["logits"], rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("name", ["native.png", "larger.png", "odd.png", "wide.png", "noise.png", "rgba.png",
                                  "palette.png", "grey.png", "grey16.png", "photo.jpg", "noise.jpg", "grey.jpg"])
def test_dumped_image_equals_python_preprocessing_bit_for_bit(runner, package, pipeline, images, name, tmp_path):
    pre = pipeline[0]
    run_runner(package, images[name], "what shape is it?", dump=tmp_path, preprocess_only=True)
    dumped = np.fromfile(tmp_path / "image.f32", np.float32).reshape(3, pre.image_size, pre.image_size)
    np.testing.assert_array_equal(dumped, P.decode_image(images[name].read_bytes(), pre))


@pytest.mark.parametrize("question", ["what is the color of the shape?", "Is there a BLUE,circle?!",
                                      "\tIS it a zebra's (odd) shape?\n"])
def test_dumped_question_equals_the_tokenizer(runner, package, pipeline, images, question, tmp_path):
    pre, tokenizer = pipeline[:2]
    run_runner(package, images["native.png"], question, dump=tmp_path, preprocess_only=True)
    ids, mask = tokenizer.encode(question, pre.max_text_length, "question")
    np.testing.assert_array_equal(np.fromfile(tmp_path / "question_ids.i32", np.int32), ids)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "question_mask.f32", np.float32), mask)


def test_wordpiece_assets_tokenise_as_tokenizers_does(runner, pipeline, images, tmp_path):
    """A package with a WordPiece tokenizer (a pretrained text encoder's): the exporter's device assets,
    read by the runner, give the ids of the `tokenizers` library."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from mindvl.export.lite2_folder import device_assets

    words = ["what", "color", "is", "the", "shape", "sha", "##pe", "##s", "un", "##know", "##n", "?", ","]
    vocab = {token: i for i, token in enumerate([*P.SPECIAL_TOKENS, *words])}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token=P.UNK, continuing_subword_prefix="##"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer = P.TextTokenizer(wordpiece)
    pre = dataclasses.replace(pipeline[0], max_text_length=20)
    (tmp_path / "pkg" / "lite2").mkdir(parents=True)
    device_assets(tmp_path / "pkg" / "lite2", tokenizer, ["yes", "no"], pre, {"vqa": "lite2/vqa.mindir"}, 1)
    question = "What COLOR is the shapes,unknown zebra?"  # shape ##s, un ##know ##n, zebra -> [UNK]
    run_runner(tmp_path / "pkg", images["native.png"], question, dump=tmp_path / "dump", preprocess_only=True)
    ids, _ = tokenizer.encode(question, pre.max_text_length, "question")
    assert P.UNK in tokenizer.tokens(question) and "##know" in tokenizer.tokens(question)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "dump" / "question_ids.i32", np.int32), ids)


@pytest.mark.parametrize("kind", ["garbage", "truncated.png", "truncated.jpg"])
def test_a_bad_image_exits_2_naming_the_file(runner, package, images, kind, tmp_path):
    if kind == "garbage":
        data = b"this is not an image"
    else:
        whole = images["noise.png" if kind.endswith("png") else "noise.jpg"].read_bytes()
        data = whole[:len(whole) // 2]
    bad = tmp_path / f"bad-{kind}.png"
    bad.write_bytes(data)
    with pytest.raises(RunnerFailed) as failed:
        run_runner(package, bad, "what color is the shape?")
    assert failed.value.returncode == 2
    assert str(bad) in str(failed.value)
    # Python refuses the same bytes
    with pytest.raises(P.InputError):
        P.open_image(data)


def test_a_question_longer_than_max_text_length_exits_2(runner, package, pipeline, images):
    limit = pipeline[0].max_text_length
    with pytest.raises(RunnerFailed) as failed:
        run_runner(package, images["native.png"], " ".join(["shape"] * limit))
    assert failed.value.returncode == 2
    assert f"{limit + 2} tokens" in str(failed.value) and "max_text_length" in str(failed.value)


def test_a_folder_without_device_assets_exits_2_naming_the_file(runner, images, tmp_path):
    with pytest.raises(RunnerFailed) as failed:
        run_runner(tmp_path, images["native.png"], "what color is the shape?")
    assert failed.value.returncode == 2
    assert str(tmp_path / "lite2" / "preprocess.txt") in str(failed.value)
    assert "mindvl export --target lite2" in str(failed.value)
