"""`mindvl data build --from-folder`: a folder of real easy-VQA images with one of every bad input injected."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bad_inputs import CONVERSATION_REASONS, CONVERSATIONS, CYRILLIC_QUESTION, EXPECTED, LONG_QUESTION, SPOKEN, easy_pairs, easy_path, make_user_folder
from conftest import TEST_VOICES
from mindvl.errors import ConfigError
from mindvl.data import records
from mindvl.data.build.builder import build_dataset
from mindvl.data.conversation_samples import read_conversation_table

TRAIN_VOICES = ["en-us"]
SETTINGS = [f"data.train_voices=[{', '.join(TRAIN_VOICES)}]", f"data.test_voices=[{', '.join(TEST_VOICES)}]",
            "data.speech_rates=[175]", "data.limit=0", "data.batch_size=8", "data.num_workers=1"]


@pytest.fixture(scope="module")
def user_build(tmp_path_factory):
    """(report, root, folder, quarantine records) of one build of the injected folder."""
    from mindvl.config import load_config

    base = tmp_path_factory.mktemp("user")
    folder = make_user_folder(base / "data")
    cfg = load_config("tiny", [f"data.root={base / 'root'}", f"data.source={folder}", *SETTINGS])
    report = build_dataset(cfg, progress=False)
    root = Path(cfg.data.root)
    drops = [json.loads(line) for line in (root / "quarantine.jsonl").read_text().splitlines()]
    return report, root, folder, drops


def _line_of(folder, ref):
    name, number = ref.split()[0].split(":")
    return (folder / name).read_text(encoding="utf-8").splitlines()[int(number) - 1]


def _only(drops, **match):
    found = [d for d in drops if all(d.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_every_injected_file_is_quarantined_with_its_reason_and_first_line(user_build):
    _, _, folder, drops = user_build
    for name, reason in EXPECTED.items():
        record = next((d for d in drops if d["source"].endswith(name.split("/")[1])), None)
        assert record is not None, name
        assert record["reason"] == reason and record["split"] == "train", (name, record)
        assert name in _line_of(folder, record["source"])  # the line number points at a line naming it


def test_measured_values_and_thresholds_are_recorded(user_build):
    report, _, _, drops = user_build
    clean = report.settings["cleaning"]
    blank = _only(drops, reason="image_low_information")
    assert (blank["value"], blank["threshold"]) == (0.0, clean["min_entropy"])
    near = _only(drops, reason="image_near_duplicate")
    assert 0 <= near["value"] <= near["threshold"] == clean["max_hash_distance"] and "train_4.png" in near["note"]
    assert _only(drops, reason="audio_empty")["value"] == 0
    assert _only(drops, reason="audio_silent")["value"] == "-inf"
    clipped = _only(drops, reason="audio_clipped")
    assert clipped["value"] > clipped["threshold"] == clean["max_clipped_fraction"]
    assert _only(drops, reason="audio_nonfinite")["value"] == 100  # the NaN samples written into the WAV
    assert "Truncated" in _only(drops, reason="bad_image", source="train.jsonl:72 images/truncated.png")["value"]
    assert report.resampled == [{"split": "train", "source": "train.jsonl:80 rate8k.wav", "from": 8000,
                                 "to": 16000}]


def test_malformed_lines_are_quarantined_with_their_line_numbers(user_build):
    _, _, _, drops = user_build
    lines = {d["source"]: d["value"] for d in drops if d["reason"] == "bad_line"}
    assert set(lines) == {"train.jsonl:4", "train.jsonl:6", "test.jsonl:3"}
    assert "not valid JSON" in lines["train.jsonl:4"] and "'answer'" in lines["train.jsonl:6"]
    assert "JSON object" in lines["test.jsonl:3"]


def test_bad_texts_are_dropped_and_a_stray_symbol_becomes_unk(user_build):
    _, root, _, drops = user_build
    long = _only(drops, reason="question_too_long")
    assert (long["value"], long["threshold"]) == (22, 14) and LONG_QUESTION in long["note"]
    foreign = _only(drops, reason="question_charset")
    assert foreign["value"] == round(17 / 18, 4) and CYRILLIC_QUESTION in foreign["note"]
    meta = json.loads((root / "meta.json").read_text())
    assert "what color is the shape [UNK]?" in meta["questions"]
    assert LONG_QUESTION not in meta["questions"] and CYRILLIC_QUESTION not in meta["questions"]


def test_copies_lend_their_questions_to_the_original_and_a_test_copy_leaves_train(user_build):
    _, root, _, drops = user_build
    meta = json.loads((root / "meta.json").read_text())
    train = records.read_split(root, "train", ["image", "question_id", "image_id"])
    by_image = {}
    for row in train:
        by_image.setdefault(row["image"], set()).add(meta["questions"][row["question_id"]])
    original = easy_path("train", 2).read_bytes()
    asked = {q for q, _ in easy_pairs("train", 2)}
    extra = by_image[original] - asked
    assert len(extra) == 1  # the question only the copy asked, now a row of the original image
    assert _only(drops, reason="duplicate", source="train.jsonl:64")["note"].startswith("image train.jsonl:21")
    assert easy_path("train", 5).read_bytes() not in by_image  # in test as well: a leak, removed from train
    leak = _only(drops, reason="image_duplicate", source="train.jsonl:55 images/train_5.png")
    assert "test split" in leak["note"]
    test = records.read_split(root, "test", ["image"])
    assert easy_path("train", 5).read_bytes() in {row["image"] for row in test}
    assert len({row["sample_id"] for row in records.read_split(root, "train", ["sample_id"])}) == len(train)


def test_recordings_become_clips_of_their_question_and_bad_ones_fall_back_to_espeak(user_build):
    report, root, _, drops = user_build
    meta = json.loads((root / "meta.json").read_text())
    clips = records.read_table(root / "speech.mindrecord", ["question_id", "voice", "split", "rate"])
    voices = {}
    for clip in clips:
        voices.setdefault((clip["split"], meta["questions"][clip["question_id"]]), set()).add(clip["voice"])
    for name, (question, _) in SPOKEN.items():
        expected = {"user"} if name in ("good.wav", "rate8k.wav") else set(TRAIN_VOICES)
        assert voices[("train", question)] == expected, name
    assert all(0 < c["rate"] < 400 for c in clips if c["voice"] == "user")  # measured words per minute
    assert report.counts["speech"]["user_clips"] == 2
    assert not [d for d in drops if d["reason"] == "no_audio"]


def test_conversation_lines_are_cleaned_into_the_conversation_table(user_build):
    report, root, folder, drops = user_build
    lines = (folder / "train.jsonl").read_text(encoding="utf-8").splitlines()
    numbers = [n for n, line in enumerate(lines, start=1) if '"conversations"' in line]
    assert len(numbers) == len(CONVERSATIONS)
    by_source = {d["source"]: d for d in drops}
    for number, reason in zip(numbers, CONVERSATION_REASONS):
        found = by_source.get(f"train.jsonl:{number}")
        assert (found and found["reason"]) == reason, (number, found)
    assert "must be a path inside the JSONL's folder" in by_source[f"train.jsonl:{numbers[5]}"]["value"]
    assert "already used by train.jsonl:" in by_source[f"train.jsonl:{numbers[7]}"]["value"]
    samples = {s.id: s for s in read_conversation_table(root, "train")}
    own = [samples[f"c{numbers[0]}"], samples[f"c{numbers[1]}"], samples["c-twice"]]
    assert [s.kind for s in own] == ["user"] * 3 and own[2].turns[1].parts == ("one",)
    assert own[0].image == (folder / "images/train_0.png").read_bytes() and own[0].attachments == (1, 1)
    assert len(own[0].audio) % 2 == 0 and len(own[0].audio) > 16000  # int16 PCM at 16 kHz, about 2 s
    assert own[1].image is None and own[1].attachments == (0, 0) and len(own[1].turns) == 4
    kinds = report.counts["train"]["conversation_kinds"]
    assert kinds["user"] == 3 and kinds["vqa"] == kinds["spoken"] == report.counts["train"]["examples"]
    assert report.counts["train"]["conversations"] == len(samples) == sum(kinds.values())
    assert report.counts["test"]["conversation_kinds"].get("user", 0) == 0


def test_meta_lists_come_from_the_data(user_build):
    report, root, _, _ = user_build
    meta = json.loads((root / "meta.json").read_text())
    assert meta["answers"] == sorted(meta["answers"]) and "rectangle" in meta["answers"]
    assert "a blue rectangle" in meta["captions"]  # given as "A  Blue RECTANGLE" on one line of image 0
    assert meta["counts"]["train"]["examples"] == report.counts["train"]["examples"] > 40
    assert meta["source"] == report.settings["source"]


def test_corrupt_files_are_copied_into_quarantine(user_build):
    _, root, folder, drops = user_build
    copied = [d for d in drops if d.get("copy")]
    assert {d["reason"] for d in copied} == {"bad_image", "bad_audio", "audio_nonfinite"}
    for d in copied:
        line = json.loads(_line_of(folder, d["source"]))
        source = folder / line["image" if d["unit"] == "image" else "audio"]
        assert (root / d["copy"]).read_bytes() == source.read_bytes(), d


def test_the_cli_prints_the_kept_and_dropped_table(user_build):
    _, root, folder, _ = user_build
    args = [sys.executable, "-m", "mindvl.cli", "data", "build", "--from-folder", str(folder), "--root", str(root)]
    for setting in SETTINGS:
        args += ["--set", setting]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "(already built)" in out and "kept examples" in out and "conversations" in out
    assert "audio_clipped (clips)" in out and "bad_line (lines)" in out and "image_duplicate (images)" in out


def test_a_missing_folder_or_split_file_is_a_config_error(tmp_path, make_config):
    with pytest.raises(ConfigError, match=r"data\.source: .* is not a folder"):
        build_dataset(make_config(tmp_path / "root", data__source=str(tmp_path / "nowhere")), progress=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no test.jsonl"):
        build_dataset(make_config(tmp_path / "root", data__source=str(tmp_path / "data")), progress=False)
