"""Conversation samples: a user's JSONL read with every bad line quarantined by number and reason, and the
conversations a build derives from easy-VQA."""
import json
from collections import Counter
from pathlib import Path

import pytest

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, placeholder_count
from mindvl.data.conversation_samples import DESCRIBE, read_conversation_table, read_conversations
from mindvl.data.records import SPEECH_TABLE, read_split, read_table
from mindvl.errors import InputError


def _line(**sample):
    return json.dumps(sample)


def test_a_jsonl_file_is_read_and_every_bad_line_quarantined_with_its_reason(tmp_path):
    (tmp_path / "img.png").write_bytes(b"png bytes")
    (tmp_path / "q.wav").write_bytes(b"wav bytes")
    (tmp_path / "second.png").write_bytes(b"second png")
    good = [{"from": "human", "value": "<image>\n<audio>"}, {"from": "gpt", "value": "a circle"}]
    lines = [
        _line(id="a", image="img.png", audio="q.wav", conversations=good),
        "{not json",
        _line(id="b", image="missing.png", conversations=[{"from": "human", "value": "<image>\nq"},
                                                          {"from": "gpt", "value": "x"}]),
        _line(id="c", image="img.png", conversations=[{"from": "human", "value": "no placeholder"},
                                                      {"from": "gpt", "value": "x"}]),
        _line(id="d", conversations=[{"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "x"}]),
        _line(id="e", conversations=[{"from": "gpt", "value": "x"}]),
        _line(id="f", picture="img.png", conversations=good),
        _line(id="a", conversations=[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]),
        "",
        _line(id="g", conversations=[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]),
        "[1, 2]",
        _line(id="h", image=["img.png", "second.png"], conversations=[{"from": "human", "value": "<image><image>\nq"},
                                                                     {"from": "gpt", "value": "x"}]),
        _line(id="i", image=["img.png", "second.png"], conversations=[{"from": "human", "value": "<image>\nq"},
                                                                     {"from": "gpt", "value": "x"}]),
        _line(id="j", image=[], conversations=[{"from": "human", "value": "q"}, {"from": "gpt", "value": "x"}]),
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = read_conversations(path)
    assert [s.id for s in read.samples] == ["a", "g", "h"]
    assert read.samples[2].images == [b"png bytes", b"second png"] and read.samples[2].attachments == (2, 0)
    first = read.samples[0]
    assert first.image == b"png bytes" and first.audio == b"wav bytes" and first.attachments == (1, 1)
    assert placeholder_count(first.turns, IMAGE_SLOT) == 1 and placeholder_count(first.turns, AUDIO_SLOT) == 1
    reasons = {q.line: q.reason for q in read.quarantined}
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8, 11, 13, 14]
    assert "1 <image> placeholder(s) for 2 image attachment(s)" in reasons[13]
    assert "image: an empty list" in reasons[14]
    assert reasons[2].startswith("not JSON")
    assert "missing.png does not exist" in reasons[3]
    assert "0 <image> placeholder(s) for 1 image attachment(s)" in reasons[4]
    assert "1 <image> placeholder(s) for 0 image attachment(s)" in reasons[5]
    assert "expected the user's turn" in reasons[6]
    assert "unknown key(s) ['picture']" in reasons[7]
    assert "id 'a' already used on line 1" in reasons[8]
    assert "expected a JSON object" in reasons[11]
    with pytest.raises(InputError, match="no such file"):
        read_conversations(tmp_path / "nothing.jsonl")


def test_a_build_derives_typed_spoken_caption_multi_turn_and_two_image_conversations(small_cfg, small_report):
    root = small_cfg.data.root
    samples = read_conversation_table(root, "train")
    kinds = Counter(s.kind for s in samples)
    assert kinds["vqa"] == kinds["spoken"] == small_report.counts["train"]["examples"]
    assert kinds["caption"] == small_report.counts["train"]["images_used"] and kinds["multi"] == kinds["caption"] // 4
    assert kinds["pair"] == kinds["multi"]  # each multi-turn image with the one described before it
    assert len({s.id for s in samples}) == len(samples)
    examples = {row["sample_id"]: row for row in read_split(root, "train", ["sample_id", "image_id", "question_id"])}
    clips = {(row["question_id"], row["split"]) for row in read_table(Path(root) / SPEECH_TABLE,
                                                                       ["question_id", "split"])}
    for sample in samples:
        assert sample.image and placeholder_count(sample.turns, IMAGE_SLOT) == len(sample.images) == \
            (2 if sample.kind == "pair" else 1) and sample.audio is None
        assert placeholder_count(sample.turns, AUDIO_SLOT) == (sample.kind == "spoken") == (sample.question_id >= 0)
        if sample.kind in ("vqa", "spoken"):  # "train-<sample_id>-vqa": the example it derives from
            example = examples[int(sample.id.split("-")[1])]
            assert sample.image_id == example["image_id"]
            if sample.kind == "spoken":
                assert sample.question_id == example["question_id"] and (sample.question_id, "train") in clips
    pair = next(s for s in samples if s.kind == "pair")
    captions = {s.image: s.turns[1].parts[0] for s in samples if s.kind == "caption"}
    assert pair.turns[1].parts == (f"{captions[pair.images[0]]}, then {captions[pair.images[1]]}",)
    ids = {s.image: s.image_id for s in samples if s.kind == "caption"}
    assert (pair.other_image_id, pair.image_id) == (ids[pair.images[0]], ids[pair.images[1]])  # both recorded
    multi = next(s for s in samples if s.kind == "multi")
    assert [t.role for t in multi.turns] == ["user", "assistant", "user", "assistant"]
    assert multi.turns[2].parts == (DESCRIBE,)
    test = read_conversation_table(root, "test")
    assert {s.kind for s in test} >= {"vqa", "spoken", "caption"}
    assert all((s.question_id, "test") in clips for s in test if s.kind == "spoken")  # the unseen voices
