import json
import time
from collections import defaultdict
from pathlib import Path

import easy_vqa
import pytest

from mindvl.config import ConfigError
from mindvl.data import build, records
from mindvl.data.build import build_dataset



def _source_pairs(split):
    get = easy_vqa.get_train_questions if split == "train" else easy_vqa.get_test_questions
    pairs = defaultdict(list)
    for q, a, i in zip(*get()):
        pairs[int(i)].append((q, a))
    return pairs


def test_build_writes_every_table_and_a_report_that_matches_them(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    assert build.is_complete(root)
    on_disk = json.loads((root / "report.json").read_text())
    assert on_disk["counts"] == small_report.counts
    meta = json.loads((root / "meta.json").read_text())
    assert meta["answers"] == easy_vqa.get_answers()
    assert len(meta["questions"]) == 107 and meta["questions"] == sorted(set(meta["questions"]))
    assert meta["captions"] == sorted(set(meta["captions"]))
    assert meta["train_voices"] == small_cfg.data.train_voices and meta["test_voices"] == small_cfg.data.test_voices
    assert meta["preprocess"]["n_mels"] == small_cfg.preprocess.n_mels
    for split in ("train", "test"):
        rows = records.read_table(root / f"{split}.mindrecord", columns=["image_id", "question_id"])
        counts = small_report.counts[split]
        assert counts["images"] == 8
        assert counts["examples"] == len(rows) > 0
        assert {r["image_id"] for r in rows} <= set(range(8))
        assert len({(r["image_id"], r["question_id"]) for r in rows}) == len(rows)  # deduplicated
        # every question of every kept image is either written or counted under a reason
        source = _source_pairs(split)
        captioned = {r["image_id"] for r in rows}
        assert len(rows) == sum(len(source[i]) for i in captioned)
        assert counts["images_used"] == len(captioned) == 8 - small_report.skips_by_split[split].get("no_caption", 0)
    assert set(small_report.skips) == set(build.SKIP_REASONS)
    assert small_report.voices == {"train": small_cfg.data.train_voices, "test": small_cfg.data.test_voices}
    assert small_report.seconds["total"] > 0


def test_rebuilding_the_same_settings_returns_the_existing_root(small_cfg, small_report):
    start = time.perf_counter()
    again = build_dataset(small_cfg, progress=False)
    assert again.already_built and again.counts == small_report.counts
    assert time.perf_counter() - start < 2.0


def test_captions_name_the_shape_and_colour_the_questions_give(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    meta = json.loads((root / "meta.json").read_text())
    source = _source_pairs("train")
    rows = records.read_table(root / "train.mindrecord", columns=["image_id", "caption_id"])
    caption_of = {r["image_id"]: meta["captions"][r["caption_id"]] for r in rows}
    checked = 0
    for image_id, caption in caption_of.items():
        for question, answer in source[image_id]:
            if question.startswith("what shape") or (question.startswith("what is the ") and
                                                     question.endswith(" shape?") and "color" not in question):
                assert caption.endswith(" " + answer), (image_id, question, answer, caption)
                checked += 1
            if question.startswith("what color") or question.startswith("what is the color"):
                assert caption.startswith(f"a {answer} "), (image_id, question, answer, caption)
                checked += 1
    assert checked >= 4


def test_examples_keep_the_source_question_and_answer(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    meta = json.loads((root / "meta.json").read_text())
    source = _source_pairs("test")
    rows = records.read_table(root / "test.mindrecord", columns=["image_id", "question_id", "answer_id"])
    for r in rows:
        pair = (meta["questions"][r["question_id"]], meta["answers"][r["answer_id"]])
        assert pair in source[r["image_id"]]
    png = records.read_table(root / "test.mindrecord", columns=["image_id", "image"])[0]
    assert png["image"] == Path(easy_vqa.get_test_image_paths()[png["image_id"]]).read_bytes()


def test_each_split_hears_only_its_own_voices(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    clips = records.read_table(root / "speech.mindrecord", columns=["question_id", "voice", "rate", "split"])
    by_split = defaultdict(set)
    for c in clips:
        by_split[c["split"]].add(c["voice"])
        assert c["rate"] == 175
    assert by_split["train"] == set(small_cfg.data.train_voices) and len(by_split["train"]) == 2
    assert by_split["test"] == set(small_cfg.data.test_voices)
    assert len({(c["question_id"], c["voice"], c["rate"]) for c in clips}) == len(clips)  # each synthesised once
    examples = records.read_table(root / "test.mindrecord", columns=["question_id"])
    spoken = {c["question_id"] for c in clips if c["split"] == "test"}
    assert {r["question_id"] for r in examples} <= spoken


def test_a_corrupt_source_image_is_quarantined_and_counted(tmp_path, monkeypatch, make_config):
    corrupt = tmp_path / "broken.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 8)
    real = easy_vqa.get_train_image_paths

    def patched():
        paths = dict(real())
        paths[1] = str(corrupt)
        return paths

    monkeypatch.setattr(easy_vqa, "get_train_image_paths", patched)
    cfg = make_config(tmp_path / "root", data__limit=3, data__train_voices="[en-us]")
    report = build_dataset(cfg, progress=False)
    assert report.skips["bad_image"] == 1 and report.skips_by_split["train"]["bad_image"] == 1
    assert report.quarantined == ["quarantine/train_1.png"]
    assert (tmp_path / "root" / "quarantine" / "train_1.png").read_bytes() == corrupt.read_bytes()
    rows = records.read_table(tmp_path / "root" / "train.mindrecord", columns=["image_id"])
    assert rows and 1 not in {r["image_id"] for r in rows}
    assert report.counts["train"]["images_used"] <= 2


def test_an_interrupted_build_leaves_no_root_that_looks_complete(tmp_path, monkeypatch, make_config):
    original = records.write_table

    def fail_on_test_table(path, *args, **kwargs):
        if Path(path).name == "test.mindrecord":
            raise KeyboardInterrupt("simulated interrupt")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(records, "write_table", fail_on_test_table)
    cfg = make_config(tmp_path / "root", data__limit=1, data__train_voices="[en-us]")
    with pytest.raises(KeyboardInterrupt):
        build_dataset(cfg, progress=False)
    assert not (tmp_path / "root").exists()
    assert list(tmp_path.iterdir()) == []  # the partial folder is gone too


def test_an_unknown_voice_is_a_config_error_naming_the_key(tmp_path, make_config):
    cfg = make_config(tmp_path / "root", data__test_voices="[en-zz+f3]")
    with pytest.raises(ConfigError, match=r"data\.test_voices\[0\].*en-gb"):
        build_dataset(cfg, progress=False)


def test_refuses_to_replace_a_folder_that_is_not_a_data_set(tmp_path, make_config):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match="not a mindvl data set"):
        build_dataset(make_config(tmp_path / "root"), progress=False)
    assert (tmp_path / "root" / "thesis.tex").read_text() == "precious"


def test_over_long_questions_and_clips_are_counted_skips_not_failures(tmp_path, make_config):
    # 10 tokens with [CLS]/[SEP] drops the longest questions; 100 frames (2 s) drops the slowest clips
    cfg = make_config(tmp_path / "root", data__limit=4, data__train_voices="[en-us]",
                      preprocess__max_text_length=10, preprocess__max_audio_frames=100)
    report = build_dataset(cfg, progress=False)
    assert report.skips["question_too_long"] > 0
    assert report.skips["bad_audio"] > 0
    tokenizer_limit = cfg.preprocess.max_text_length - 2
    meta = json.loads((tmp_path / "root" / "meta.json").read_text())
    rows = records.read_table(tmp_path / "root" / "train.mindrecord", columns=["question_id"])
    assert rows
    assert all(len(meta["questions"][r["question_id"]].replace("?", " ?").split()) <= tokenizer_limit for r in rows)
