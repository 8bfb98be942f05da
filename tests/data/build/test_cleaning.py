"""The cleaning checks on real inputs: easy-VQA images, espeak-ng speech, and broken copies of them."""
import io
import json

import easy_vqa
import numpy as np
import pytest
from PIL import Image, ImageFile, ImageFilter

from bad_inputs import (blank_png_bytes, easy_pairs, easy_path, jpeg_bytes, resaved_png_bytes, spoken,
                        write_wav)
from mindvl import preprocess as P
from mindvl.errors import ConfigError
from mindvl.config import CleaningConfig, PreprocessConfig, load_config
from mindvl.data.build import cleaning, easyvqa

CLEAN = CleaningConfig()
PRE = PreprocessConfig()


def _facts(data):
    return cleaning.inspect_image(data, CLEAN.hash)


def _png(img):
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


# ----------------------------------------------------------------------------- images

def test_a_resaved_png_has_the_same_pixel_hash_and_a_jpeg_copy_a_close_hash_and_thumbnail():
    original = easy_path("train", 4)
    a, b, c = _facts(original.read_bytes()), _facts(resaved_png_bytes(original)), _facts(jpeg_bytes(original))
    assert a.pixel_sha256 == b.pixel_sha256 and a.hash == b.hash
    assert a.pixel_sha256 != c.pixel_sha256
    assert cleaning.hamming(a.hash, c.hash) <= CLEAN.max_hash_distance
    assert cleaning.thumbnail_difference(a, c) <= CLEAN.max_pixel_difference


def test_perceptual_hashes_alone_would_merge_different_shapes_so_captions_gate_near_duplicates():
    """Why near-duplicates need the caption check: flat shapes on pale backgrounds hash alike."""
    facts = {i: _facts(easy_path("train", i).read_bytes()) for i in range(400)}
    captions = {i: easyvqa.derive_caption(easy_pairs("train", i))[0] for i in facts}
    index = cleaning.HashIndex(CLEAN.max_hash_distance)
    close = []
    for i in sorted(facts):
        close += [(j, i) for j, _ in index.query(facts[i].hash)]
        index.add(i, facts[i].hash)
    different = [(i, j) for i, j in close if captions[i] and captions[j] and captions[i] != captions[j]]
    assert len(different) >= 3  # e.g. a small red triangle and a small yellow circle on similar backgrounds


def test_the_default_image_checks_keep_real_easy_vqa_images():
    paths = easy_vqa.get_test_image_paths()
    for i in range(0, 1000, 4):
        facts = _facts(open(paths[i], "rb").read())
        assert cleaning.image_quality_problem(facts, CLEAN) is None, (i, facts.entropy, facts.sharpness)


def test_a_blank_image_is_low_information_and_a_blurred_one_blurry():
    reason, value, threshold = cleaning.image_quality_problem(_facts(blank_png_bytes()), CLEAN)
    assert (reason, value, threshold) == ("image_low_information", 0.0, CLEAN.min_entropy)
    original = Image.open(easy_path("train", 0)).convert("RGB")
    reason, value, threshold = cleaning.image_quality_problem(
        _facts(_png(original.filter(ImageFilter.GaussianBlur(3)))), CLEAN)
    assert reason == "image_blurry" and value < threshold == CLEAN.min_sharpness
    # a yellow shape on a pale background is nearly invisible in grey but sharp in blue: still kept
    assert _facts(easy_path("train", 2598).read_bytes()).sharpness > 10 * CLEAN.min_sharpness


def test_truncated_and_garbage_images_raise_input_errors_even_when_pillow_tolerates_truncation(monkeypatch):
    png = easy_path("train", 5).read_bytes()
    jpeg = jpeg_bytes(easy_path("train", 5))
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as some augmentation code sets it
    for data in (png[: len(png) * 2 // 3], jpeg[: len(jpeg) // 2], np.random.default_rng(0).bytes(2000), b""):
        with pytest.raises(P.InputError):
            cleaning.inspect_image(data)


def test_the_hash_index_finds_exactly_what_a_brute_force_search_finds():
    hashes = {i: _facts(easy_path("test", i).read_bytes()).hash for i in range(300)}
    index = cleaning.HashIndex(4)
    for i, h in hashes.items():
        index.add(i, h)
    for i in range(0, 300, 7):
        expected = [(j, cleaning.hamming(hashes[i], h)) for j, h in hashes.items()
                    if cleaning.hamming(hashes[i], h) <= 4]
        assert index.query(hashes[i]) == expected


def test_dhash_is_a_64_bit_hash_that_survives_reencoding():
    original = easy_path("train", 4)
    a = cleaning.inspect_image(original.read_bytes(), "dhash").hash
    b = cleaning.inspect_image(jpeg_bytes(original), "dhash").hash
    assert 0 <= a < 1 << 64 and cleaning.hamming(a, b) <= 6


# ----------------------------------------------------------------------------- audio

def test_spoken_questions_pass_and_each_audio_problem_is_measured():
    good = spoken("what color is the shape?")
    assert cleaning.audio_problem(good, PRE, CLEAN) is None
    assert cleaning.audio_problem(np.zeros(0, np.float32), PRE, CLEAN)[0] == "audio_empty"
    nan = good.copy()
    nan[10:30] = np.nan
    assert cleaning.audio_problem(nan, PRE, CLEAN) == ("audio_nonfinite", 20, 0)
    reason, seconds, minimum = cleaning.audio_problem(good[:1600], PRE, CLEAN)
    assert (reason, seconds, minimum) == ("audio_too_short", 0.1, CLEAN.min_audio_seconds)
    reason, seconds, limit = cleaning.audio_problem(np.tile(good, 3), PRE, CLEAN)
    assert reason == "audio_too_long" and seconds > limit == 3.0
    noise = np.random.default_rng(0).normal(0, 10 ** (-70 / 20), PRE.sample_rate).astype(np.float32)
    reason, level, threshold = cleaning.audio_problem(noise, PRE, CLEAN)
    assert reason == "audio_silent" and abs(level + 70) < 0.5 and threshold == CLEAN.silence_dbfs
    reason, fraction, limit = cleaning.audio_problem(np.clip(good * 20, -1, 1), PRE, CLEAN)
    assert reason == "audio_clipped" and fraction > 0.1 and limit == CLEAN.max_clipped_fraction


def test_wav_files_are_read_at_their_rate_and_resampled_and_nan_survives_for_the_check(tmp_path):
    audio = spoken("is there a circle?", rate=8000)
    audio8k, rate = cleaning.read_audio(write_wav(tmp_path / "a.wav", audio, rate=8000), PRE.sample_rate)
    assert rate == 8000 and abs(audio8k.size - 2 * audio.size) <= 2
    broken = audio.copy()
    broken[5] = np.nan
    raw, rate = cleaning.read_audio(write_wav(tmp_path / "nan.wav", broken, subtype="FLOAT"), PRE.sample_rate)
    assert rate == PRE.sample_rate and np.isnan(raw).sum() == 1
    (tmp_path / "junk.wav").write_bytes(b"RIFF....WAVE" + bytes(100))
    with pytest.raises(P.InputError, match="cannot read"):
        cleaning.read_audio(tmp_path / "junk.wav", PRE.sample_rate)


def test_default_audio_thresholds_keep_every_espeak_voice_of_the_recipes():
    tiny = load_config("tiny").preprocess
    data = load_config("tiny").data
    for voice in [*data.train_voices, *data.test_voices]:
        clip = spoken("is there not a blue shape in the image?", voice=voice)
        assert cleaning.audio_problem(clip, tiny, CLEAN) is None, voice


# ----------------------------------------------------------------------------- text

def test_text_is_normalised_as_the_tokenizer_does():
    assert cleaning.normalize_text("  Ｗｈａｔ   COLOR’s\tthe\u00a0shape？ ") == "what color's the shape?"


def test_text_checks_measure_length_words_and_characters():
    check = cleaning.clean_text
    assert check("What color is the shape?", "question", 16, 2, CLEAN).text == "what color is the shape?"
    long = check("is " * 20 + "it?", "question", 16, 2, CLEAN)
    assert (long.text, long.reason, long.value, long.threshold) == (None, "question_too_long", 24, 16)
    short = check("why?", "question", 16, 2, CLEAN)
    assert (short.reason, short.value, short.threshold) == ("question_too_short", 1, 2)
    foreign = check("какого цвета фигура?", "question", 16, 2, CLEAN)
    assert foreign.reason == "question_charset" and foreign.value == round(17 / 18, 4)
    mapped = check("what color is the shape 🙂?", "question", 16, 2, CLEAN)
    assert mapped.text == "what color is the shape [UNK]?"
    strict = CleaningConfig(unknown_chars="drop")
    assert check("what color is the shape 🙂?", "question", 16, 2, strict).reason == "question_charset"
    assert check("", "answer", 4, 1, CLEAN).reason == "answer_too_short"


def test_an_unk_mapped_question_encodes_to_the_unk_id():
    tokenizer = P.build_word_tokenizer(["what color is the shape?"])
    ids, _ = tokenizer.encode("what color is the shape [UNK]?", 12)
    assert list(ids[:9]) == [tokenizer.cls_id, *tokenizer.tokenizer.encode("what color is the shape", add_special_tokens=False).ids,
                             tokenizer.unk_id, tokenizer.tokenizer.token_to_id("?"), tokenizer.sep_id]
    assert "unk" not in tokenizer.tokenizer.get_vocab()


# ----------------------------------------------------------------------------- config and log

@pytest.mark.parametrize("key, value", [("hash", "md5"), ("max_hash_distance", -2), ("max_hash_distance", 65),
                                        ("max_pixel_difference", 300), ("min_sharpness", -1),
                                        ("min_entropy", 30), ("min_audio_seconds", -0.5), ("silence_dbfs", 3),
                                        ("max_clipped_fraction", 1.5), ("min_words", -1), ("alphabet", "ABC"),
                                        ("unknown_chars", "ignore"), ("max_unknown_fraction", 2),
                                        ("align_min_similarity", 1.5), ("bogus", 1)])
def test_every_threshold_is_validated_naming_its_key(key, value):
    with pytest.raises(ConfigError, match=rf"data\.cleaning\.{key}"):
        load_config("tiny", [f"data.cleaning.{key}={value}"])


def test_data_shards_and_integer_thresholds_are_typed():
    with pytest.raises(ConfigError, match=r"data\.shards"):
        load_config("tiny", ["data.shards=0"])
    with pytest.raises(ConfigError, match=r"data\.cleaning\.max_hash_distance: expected an integer"):
        load_config("tiny", ["data.cleaning.max_hash_distance=near"])


def test_a_quarantine_record_is_one_json_line_with_the_measured_value():
    log = cleaning.Quarantine()
    log.add("train", "train.jsonl:3 audio/a.wav", "audio_silent", -71.234567891, -50.0)
    record = json.loads(log.drops[0].to_json())
    assert record == {"split": "train", "unit": "clip", "source": "train.jsonl:3 audio/a.wav",
                      "reason": "audio_silent", "value": -71.234568, "threshold": -50.0}
    assert log.counts()["train"]["audio_silent"] == 1
    with pytest.raises(KeyError, match="unknown drop reason"):
        log.add("train", "x", "looks_odd")

