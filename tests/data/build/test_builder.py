import dataclasses
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path

import easy_vqa
import numpy as np
import pytest

import mindvl
from mindvl.errors import ConfigError
from mindvl.data import records
from mindvl.data.build.builder import build_dataset
from mindvl.data.build.report import SKIP_REASONS
from mindvl.data.root import is_complete, partial_folder
from mindvl.files import sha256_file


def _source_pairs(split):
    get = easy_vqa.get_train_questions if split == "train" else easy_vqa.get_test_questions
    pairs = defaultdict(list)
    for q, a, i in zip(*get()):
        pairs[int(i)].append((q, a))
    return pairs


def test_build_writes_every_table_and_a_report_that_matches_them(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    assert is_complete(root)
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
    assert set(small_report.skips) == set(SKIP_REASONS)
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
    partial = partial_folder(tmp_path / "root")
    assert list(tmp_path.iterdir()) == [partial]  # kept for the next run to resume, hidden, and incomplete
    assert partial.name.startswith(".") and not is_complete(partial)
    assert not (partial / ".lock").exists()


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
    assert report.skips["audio_too_long"] > 0
    drops = [json.loads(line) for line in (tmp_path / "root" / "quarantine.jsonl").read_text().splitlines()]
    too_long = [d for d in drops if d["reason"] == "audio_too_long"]
    assert too_long and all(d["value"] > d["threshold"] == 2.0 for d in too_long)
    tokenizer_limit = cfg.preprocess.max_text_length - 2
    meta = json.loads((tmp_path / "root" / "meta.json").read_text())
    rows = records.read_table(tmp_path / "root" / "train.mindrecord", columns=["question_id"])
    assert rows
    assert all(len(meta["questions"][r["question_id"]].replace("?", " ?").split()) <= tokenizer_limit for r in rows)


def _data_digests(root):
    """sha256 of every data file of a root (not report.json and card.json, which hold timings)."""
    root = Path(root)
    meta = json.loads((root / "meta.json").read_text())
    names = [n for split in ("train", "test") for n in meta["tables"][split]] + [records.SPEECH_TABLE]
    names = [f for n in names for f in (n, f"{n}.db")] + ["meta.json", "tokenizer.json", "quarantine.jsonl"]
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in names}


def test_two_builds_into_different_roots_are_byte_identical(small_cfg, small_report, make_config, tmp_path):
    again = build_dataset(make_config(tmp_path / "elsewhere" / "data"), progress=False)
    assert not again.already_built
    assert _data_digests(tmp_path / "elsewhere" / "data") == _data_digests(small_cfg.data.root)


def test_a_resumed_build_skips_finished_shards_and_equals_an_uninterrupted_one(tmp_path, monkeypatch, make_config):
    settings = {"data__limit": 6, "data__shards": 3, "data__train_voices": "[en-us]"}
    cfg = make_config(tmp_path / "resumed", **settings)
    original = records.write_table
    written = []

    stop = "conversations-train-00001-of-00003.mindrecord"  # the last stage: every earlier unit finished

    def interrupt_second_conversation_shard(path, *args, **kwargs):
        written.append(Path(path).name)
        if Path(path).name == stop:
            raise KeyboardInterrupt("simulated interrupt")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(records, "write_table", interrupt_second_conversation_shard)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(cfg, progress=False)
    conversations = [records.shard_names(records.conversation_table(split), 3) for split in ("train", "test")]
    finished = ["speech.mindrecord", *records.shard_names("train", 3), *records.shard_names("test", 3),
                conversations[0][0]]
    assert written == [*finished, stop]
    partial = partial_folder(tmp_path / "resumed")
    before = {name: (partial / name).stat().st_mtime_ns for name in finished}

    written.clear()
    monkeypatch.setattr(records, "write_table", lambda path, *a, **k: written.append(Path(path).name) or
                        original(path, *a, **k))
    report = build_dataset(cfg, progress=False)
    assert written == [*conversations[0][1:], *conversations[1]]
    assert report.resumed == ["speech", *finished[1:]]
    assert {name: (tmp_path / "resumed" / name).stat().st_mtime_ns for name in finished} == before
    assert not partial.exists() and not (tmp_path / "resumed" / ".done").exists()

    clean = build_dataset(make_config(tmp_path / "clean", **settings), progress=False)
    assert clean.resumed == [] and clean.counts == report.counts
    assert _data_digests(tmp_path / "resumed") == _data_digests(tmp_path / "clean")
    rows = records.read_split(tmp_path / "clean", "train", ["sample_id"])
    assert [r["sample_id"] for r in rows] == list(range(report.counts["train"]["examples"]))


def test_a_changed_shard_file_is_rewritten_on_resume(tmp_path, monkeypatch, make_config):
    cfg = make_config(tmp_path / "root", data__limit=2, data__shards=2, data__train_voices="[en-us]")
    original = records.write_table

    def interrupt_test(path, *args, **kwargs):
        if Path(path).name.startswith("test"):
            raise KeyboardInterrupt("simulated interrupt")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(records, "write_table", interrupt_test)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(cfg, progress=False)
    shard = partial_folder(tmp_path / "root") / "train-00001-of-00002.mindrecord"
    shard.write_bytes(shard.read_bytes()[:-10])  # damaged after its done marker was written
    monkeypatch.setattr(records, "write_table", original)
    report = build_dataset(cfg, progress=False)
    assert report.resumed == ["speech", "train-00000-of-00002.mindrecord"]
    card = json.loads((tmp_path / "root" / "card.json").read_text())
    assert card["files"]["train-00001-of-00002.mindrecord"]["sha256"] == sha256_file(
        tmp_path / "root" / "train-00001-of-00002.mindrecord")


def test_the_dataset_card_lists_sources_licences_counts_thresholds_and_every_file(small_cfg, small_report):
    root = Path(small_cfg.data.root)
    card = json.loads((root / "card.json").read_text())
    licences = {s["name"]: s["license"] for s in card["sources"]}
    assert licences == {"easy-VQA": "MIT", "espeak-ng voices (espeakng-loader)": "GPL-3.0-or-later"}
    assert card["mindvl_version"] == mindvl.__version__ and card["build_seconds"] > 0
    assert card["cleaning"] == dataclasses.asdict(small_cfg.data.cleaning)
    for split in ("train", "test"):
        assert card["counts"][split]["examples"] == small_report.counts[split]["examples"]
        assert card["counts"][split]["shards"] == 1
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {"card.json"}
    assert set(card["files"]) == on_disk
    for name, entry in card["files"].items():
        assert entry["sha256"] == sha256_file(root / name) and entry["bytes"] == (root / name).stat().st_size


def test_the_summary_is_a_table_of_kept_and_dropped_items_per_split(small_report):
    text = small_report.summary()
    lines = text.splitlines()
    assert lines[1].split() == ["train", "test"]
    kept = next(line for line in lines if line.strip().startswith("kept examples")).split()
    assert kept[-2:] == [str(small_report.counts["train"]["examples"]), str(small_report.counts["test"]["examples"])]
    dropped = {reason for reason, n in small_report.skips.items() if n}
    for reason in dropped:
        assert f"{reason} (" in text
    assert dropped or "dropped: nothing" in text


def test_an_alignment_checkpoint_drops_pairs_it_scores_below_the_threshold(trained_run, small_cfg, make_config,
                                                                           tmp_path):
    from mindvl.eval.alignment import AlignmentScorer

    _, result = trained_run
    root = Path(small_cfg.data.root)
    meta = json.loads((root / "meta.json").read_text())
    pairs = {}
    for split in ("train", "test"):
        for row in records.read_split(root, split, ["image_id", "image", "caption_id"]):
            pairs.setdefault((split, int(row["image_id"])), (row["image"], meta["captions"][row["caption_id"]]))
    keys = sorted(pairs)
    scorer = AlignmentScorer(result.output_dir)
    scores = scorer.score([pairs[k][0] for k in keys], [pairs[k][1] for k in keys])
    assert np.all(np.abs(scores) <= 1 + 1e-6)
    threshold = float(np.round(np.median(scores), 4))
    cfg = make_config(tmp_path / "root", data__cleaning__align_checkpoint=str(result.output_dir),
                      data__cleaning__align_min_similarity=threshold)
    report = build_dataset(cfg, progress=False, scorer=scorer)
    drops = [json.loads(line) for line in (tmp_path / "root" / "quarantine.jsonl").read_text().splitlines()]
    misaligned = {(d["split"], int(d["source"].split()[-1])): d for d in drops if d["reason"] == "misaligned"}
    expected = {k for k, score in zip(keys, scores) if score < threshold}
    assert expected and set(misaligned) == expected
    for key, score in zip(keys, scores):
        if key in misaligned:
            assert abs(misaligned[key]["value"] - score) < 1e-3 and misaligned[key]["threshold"] == threshold
    assert report.alignment["dropped"] == len(expected) and report.alignment["pairs"] == len(keys)
    kept = {("train", int(r["image_id"])) for r in records.read_split(tmp_path / "root", "train", ["image_id"])}
    assert kept == {k for k, score in zip(keys, scores) if k[0] == "train" and score >= threshold}


def test_a_published_tokenizer_tokenises_the_data_and_checks_its_lengths(tmp_path, make_config, converted):
    """data.tokenizer: MiniLM's WordPiece (from a converted folder) + [BOS]/[EOS]; lengths in its tokens."""
    from tokenizers import Tokenizer

    from mindvl.data import load_meta, load_tokenizer

    folder = converted("minilm")
    cfg = make_config(tmp_path / "root", data__limit=3, data__train_voices="[en-us]", data__tokenizer=str(folder))
    build_dataset(cfg, progress=False)
    tokenizer, minilm = load_tokenizer(cfg.data.root), Tokenizer.from_file(str(folder / "tokenizer.json"))
    minilm.no_padding()  # the published file pads to 128
    assert (tokenizer.bos_id, tokenizer.eos_id) == (30522, 30523) and tokenizer.cls_id == 101
    question = load_meta(cfg.data.root)["questions"][0]
    ids, mask = tokenizer.encode(question, cfg.preprocess.max_text_length)
    assert ids[:int(mask.sum())].tolist() == minilm.encode(question).ids  # [CLS] wordpieces [SEP], as MiniLM
    # the limit counts WordPiece tokens, [CLS] and [SEP] included: questions of 10 tokens are dropped at 9
    short = make_config(tmp_path / "short", data__limit=3, data__train_voices="[en-us]",
                        data__tokenizer=str(folder), preprocess__max_text_length=9)
    report = build_dataset(short, progress=False)
    assert report.skips["question_too_long"] > 0
    drops = [json.loads(line) for line in (Path(short.data.root) / "quarantine.jsonl").read_text().splitlines()]
    assert {d["value"] for d in drops if d["reason"] == "question_too_long"} >= {10}
    kept = load_meta(short.data.root)["questions"]
    assert kept and all(tokenizer.count(q) <= 9 for q in kept)


def test_an_alignment_checkpoint_without_a_scorer_is_refused_before_any_work(make_config, tmp_path):
    """The data layer loads no model: the caller hands the scorer over (`mindvl data build` does)."""
    cfg = make_config(tmp_path / "root", data__cleaning__align_checkpoint=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"data.cleaning.align_checkpoint: .*AlignmentScorer"):
        build_dataset(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []
