"""The generative model's loader over a real built root's conversation tables: the columns MultimodalLMLoss
takes, labels exactly on the assistant's tokens and never across conversations, every conversation once
per epoch, the test split deterministic and in unseen voices, exact resume, the validation hold-out by
image, and conversations too long for a row left out and named."""
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import small_generative_config
from mindvl.data.reading.conversation_loader import (CONVERSATION_TRAIN_COLUMNS, ConversationStream, conversation_rows,
                                             create_conversation_dataset)
from mindvl.data.records import read_split
from mindvl.data.reading.splits import image_ids_of, open_split, validation_images
from mindvl.data.reading.stages import Tables

IMAGE_TOKENS, AUDIO_TOKENS = 16, 16  # vlm-tiny's projector at the tiny recipe's 64 px and 128 frames


@pytest.fixture(scope="module")
def cfg(small_cfg, small_report):
    return small_generative_config(small_cfg.data.root)


def one_image(cfg, rows, table):
    """Of a conversation table's `rows`, those this model reads: all but the two-image "pair" conversations, which
    its sizes pass leaves out (a native-resolution VLM reads them)."""
    kinds = [str(r["kind"]) for r in read_split(cfg.data.root, f"conversations-{table}", ["kind"])]
    return [int(r) for r in rows if kinds[r] != "pair"]


def _epoch(cfg, split, **kwargs):
    data = create_conversation_dataset(cfg, split, IMAGE_TOKENS, AUDIO_TOKENS, **kwargs)
    assert tuple(data.get_col_names()) == ("sample_id", *CONVERSATION_TRAIN_COLUMNS)
    return list(data.create_dict_iterator(num_epochs=1, output_numpy=True))


def test_labels_are_the_assistants_tokens_of_each_conversation_and_stay_inside_it(cfg):
    tokenizer = Tokenizer.from_file(str(Path(cfg.data.root) / "tokenizer.json"))
    rows = read_split(cfg.data.root, "conversations-test", ["sample_id", "turns"])
    answers = {int(r["sample_id"]): [t["value"] for t in json.loads(str(r["turns"]))[1::2]] for r in rows}
    for batch in _epoch(cfg, "test", batch_size=8):
        ids, segment, weight = batch["ids"], batch["segment"], batch["label_weight"]
        real = weight > 0
        at, labels = batch["label_index"][real], batch["labels"][real]
        assert weight[~real].sum() == 0 and set(weight[real]) == {1.0}
        # position p predicts token p + 1 of the same conversation: the label is that token, inside the segment
        np.testing.assert_array_equal(ids.reshape(-1)[at + 1], labels)
        assert (segment.reshape(-1)[at] == segment.reshape(-1)[at + 1]).all() and (segment.reshape(-1)[at] > 0).all()
        said = tokenizer.decode(labels.tolist(), skip_special_tokens=False).split()
        expected = [w for sid in batch["sample_id"] for answer in answers[int(sid)]
                    for w in [*tokenizer.decode(tokenizer.encode(answer, add_special_tokens=False).ids).split(), "[EOS]"]]
        assert sorted(said) == sorted(expected)
        assert batch["image"].shape[1:] == (3, cfg.preprocess.image_size, cfg.preprocess.image_size)
        assert batch["mel"].shape[1:] == (cfg.preprocess.n_mels, cfg.preprocess.max_audio_frames)


def test_the_test_split_reads_every_conversation_once_the_same_way_and_in_unseen_voices(cfg):
    first, second = _epoch(cfg, "test", batch_size=8), _epoch(cfg, "test", batch_size=8)
    for a, b in zip(first, second):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    seen = np.concatenate([b["sample_id"] for b in first])
    assert sorted(seen.tolist()) == one_image(cfg, conversation_rows(cfg, "test"), "test")
    rows = {int(r["sample_id"]): r for r in read_split(cfg.data.root, "conversations-test",
                                                       ["sample_id", "kind", "question_id"])}
    tables = Tables(Path(cfg.data.root), cfg.preprocess, "test")
    checked = 0
    for batch in first:
        for index, sid in enumerate(batch["sample_id"].tolist()):
            row = rows[sid]
            if str(row["kind"]) == "spoken":  # its clip: one of the test voices' clips of its question
                clips = tables.clip_of("test", int(row["question_id"]))
                assert any(np.array_equal(batch["mel"][index], tables.mel(c)[0]) for c in clips)
                checked += 1
            else:
                assert batch["frame_mask"][index].sum() == 0
    assert checked > 0


def test_a_conversation_stream_resumes_exactly_where_it_stood(cfg):
    stream = ConversationStream(cfg, IMAGE_TOKENS, AUDIO_TOKENS)
    batches = iter(stream)
    next(batches)
    state = stream.state()
    expected = [next(batches) for _ in range(2)]
    batches.close()
    resumed = iter(ConversationStream(cfg, IMAGE_TOKENS, AUDIO_TOKENS, state=state))
    for (ids_a, a), (ids_b, b) in zip(expected, [next(resumed) for _ in range(2)]):
        np.testing.assert_array_equal(ids_a, ids_b)
        for name, x, y in zip(stream.columns, a, b):
            np.testing.assert_array_equal(x.asnumpy(), y.asnumpy(), err_msg=name)
    resumed.close()
    assert state["examples"] == len(read_split(cfg.data.root, "conversations-train", ["sample_id"]))


def test_validation_holds_out_the_conversations_of_the_classifiers_held_out_images(cfg, small_cfg):
    """Every image a training conversation shows is a training image, a two-image "pair" included (its other image
    is recorded); validation shows only held-out ones; a pair of one of each is read by neither."""
    held_cfg = small_generative_config(small_cfg.data.root, "data.validation_fraction=0.25")
    _, files, _ = open_split(held_cfg, "train")
    held = set(validation_images(image_ids_of(files), 0.25, held_cfg.data.seed).tolist())
    rows = read_split(cfg.data.root, "conversations-train", ["image_id", "other_image_id", "kind"])
    shown = [{int(r["image_id"]), int(r["other_image_id"])} - {-1} for r in rows]
    train, validation = conversation_rows(held_cfg, "train"), conversation_rows(held_cfg, "validation")
    assert not any(shown[r] & held for r in train)
    assert all(shown[r] <= held for r in validation) and set().union(*(shown[r] for r in validation)) == held
    neither = sorted(set(range(len(rows))) - set(train) - set(validation))
    assert not set(train) & set(validation)
    assert all(str(rows[r]["kind"]) == "pair" and len(shown[r]) == 2 and len(shown[r] & held) == 1 for r in neither)
    assert any(str(rows[r]["kind"]) == "pair" for r in train)
    seen = np.concatenate([b["sample_id"] for b in _epoch(held_cfg, "validation", batch_size=8)])
    assert sorted(seen.tolist()) == one_image(cfg, validation, "train")


def test_conversations_too_long_for_a_row_are_left_out_and_named(small_cfg):
    """At 36 tokens a row: a spoken question (image, clip, answer: 38 tokens) cannot fit and is left out; a
    two-exchange conversation keeps its first exchange (truncation drops whole exchanges, never slots)."""
    short = small_generative_config(small_cfg.data.root, "data.packing.length=36")
    stream = ConversationStream(short, IMAGE_TOKENS, AUDIO_TOKENS)
    kinds = {int(r["sample_id"]): str(r["kind"]) for r in read_split(short.data.root, "conversations-train",
                                                                     ["sample_id", "kind"])}
    assert stream.left_out and not set(stream.left_out) & set(stream.rows.tolist())
    assert {kinds[r] for r in stream.left_out} == {"spoken"}
    assert all("38 tokens up to its attachments" in reason and "more than the 36 allowed" in reason
               for reason in stream.left_out.values())
    assert "multi" in {kinds[r] for r in stream.rows.tolist()}
    _, batch = next(iter(stream))
    assert batch[stream.columns.index("ids")].shape[1] == 36


def test_spoken_questions_are_speed_perturbed_in_training_the_same_way_for_the_same_epoch(small_cfg):
    """data.augment's speed / noise reach the conversations' clips in training: a spoken question's mel is none
    of its clean clips' mels, the same for the same (seed, epoch), and the clean one with augmentation off."""
    perturbed = small_generative_config(small_cfg.data.root, "data.augment.speed=[0.8, 1.25]", "data.augment.noise=1.0")
    clean = small_generative_config(small_cfg.data.root, "data.augment.enabled=false")
    tables = Tables(Path(small_cfg.data.root), clean.preprocess, "train")
    rows = {int(r["sample_id"]): r for r in read_split(small_cfg.data.root, "conversations-train",
                                                       ["sample_id", "kind", "question_id"])}

    def spoken(cfg):
        return {int(sid): mel for batch in _epoch(cfg, "train", batch_size=8)
                for sid, mel in zip(batch["sample_id"], batch["mel"]) if str(rows[int(sid)]["kind"]) == "spoken"}

    first, again, plain = spoken(perturbed), spoken(perturbed), spoken(clean)
    assert first and first.keys() == again.keys() == plain.keys()
    for sid, mel in first.items():
        np.testing.assert_array_equal(mel, again[sid])
        clips = [tables.mel(c)[0] for c in tables.clip_of("train", int(rows[sid]["question_id"]))]
        assert not any(np.array_equal(mel, c) for c in clips)
        assert any(np.array_equal(plain[sid], c) for c in clips)
