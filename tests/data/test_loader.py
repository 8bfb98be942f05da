import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl.data import COLUMNS, create_dataset, load_meta, load_tokenizer
from mindvl.data.loader import DataRootError


def _batches(dataset, epochs=1):
    """All batches of `epochs` passes through one iterator (as training consumes them)."""
    it = dataset.create_dict_iterator(num_epochs=epochs, output_numpy=True)
    return [[batch for batch in it] for _ in range(epochs)]


def _concat(batches):
    if batches and isinstance(batches[0], list):  # one epoch from _batches
        batches = [b for epoch in batches for b in epoch]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.fixture(scope="module")
def split_rows_of_test(small_cfg, small_report):
    return _concat(_batches(create_dataset(small_cfg, "test")))


def test_batches_have_exactly_the_specified_columns(small_cfg, small_report):
    pre = small_cfg.preprocess
    dataset = create_dataset(small_cfg, "train", batch_size=4)
    assert tuple(dataset.get_col_names()) == COLUMNS
    batch = next(iter(dataset.create_dict_iterator(num_epochs=1, output_numpy=True)))
    S, Lt, Ta, La, M = pre.image_size, pre.max_text_length, pre.max_audio_frames, pre.max_answer_length, pre.n_mels
    expected = {"image": ("float32", (4, 3, S, S)), "question_ids": ("int32", (4, Lt)),
                "question_mask": ("float32", (4, Lt)), "audio_mel": ("float32", (4, M, Ta)),
                "audio_mask": ("float32", (4, Ta)), "use_text": ("float32", (4,)), "use_audio": ("float32", (4,)),
                "caption_ids": ("int32", (4, Lt)), "caption_mask": ("float32", (4, Lt)), "answer": ("int32", (4,)),
                "answer_tokens": ("int32", (4, La)), "question_group": ("int32", (4,)),
                "caption_group": ("int32", (4,))}
    assert list(batch) == list(COLUMNS)
    assert {k: (str(v.dtype), v.shape) for k, v in batch.items()} == expected
    assert -1.0 <= batch["image"].min() and batch["image"].max() <= 1.0
    assert np.all(batch["audio_mask"].sum(1) > 20)  # a spoken question is more than 20 frames
    assert np.all((batch["use_text"] + batch["use_audio"]) >= 1)


def test_columns_decode_back_to_the_example(small_cfg, split_rows_of_test):
    meta = load_meta(small_cfg.data.root)
    tok = load_tokenizer(small_cfg.data.root)
    n = len(split_rows_of_test["answer"])
    assert n == small_cfg_examples(small_cfg, "test")  # test split: no shuffle, no dropped remainder
    for i in range(n):
        assert tok.decode(split_rows_of_test["question_ids"][i][1:]) == meta["questions"][split_rows_of_test["question_group"][i]]
        assert tok.decode(split_rows_of_test["caption_ids"][i][1:]) == meta["captions"][split_rows_of_test["caption_group"][i]]
        assert tok.decode(split_rows_of_test["answer_tokens"][i]) == meta["answers"][split_rows_of_test["answer"][i]]
        assert split_rows_of_test["question_mask"][i].sum() == np.count_nonzero(split_rows_of_test["question_ids"][i])
        frames = int(split_rows_of_test["audio_mask"][i].sum())
        assert np.all(split_rows_of_test["audio_mel"][i][:, frames:] == 0)


def small_cfg_examples(cfg, split):
    return json.loads((Path(cfg.data.root) / "meta.json").read_text())["counts"][split]["examples"]


def test_test_split_is_deterministic_and_train_audio_changes_between_epochs(small_cfg, split_rows_of_test):
    again = _concat(_batches(create_dataset(small_cfg, "test")))
    for name in COLUMNS:
        np.testing.assert_array_equal(again[name], split_rows_of_test[name])
    epochs = _batches(create_dataset(small_cfg, "train", shuffle=False, drop_remainder=False), epochs=2)
    first, second = _concat(epochs[0]), _concat(epochs[1])
    np.testing.assert_array_equal(first["question_group"], second["question_group"])
    changed = np.any(first["audio_mel"] != second["audio_mel"], axis=(1, 2))
    assert 0.2 < changed.mean() < 0.8  # two training voices: about half the rows hear the other voice


def test_question_modality_flags(small_cfg, small_report):
    for modality, flags in {"text": (1, 0), "audio": (0, 1), "both": (1, 1)}.items():
        rows = _concat(_batches(create_dataset(small_cfg, "test", question_modality=modality)))
        assert set(zip(rows["use_text"], rows["use_audio"])) == {flags}
    mixed = _concat(_batches(create_dataset(small_cfg, "train")))
    assert set(zip(mixed["use_text"], mixed["use_audio"])) == {(1, 0), (0, 1), (1, 1)}


def test_two_ranks_read_disjoint_shards_that_cover_the_split(small_cfg, split_rows_of_test):
    def keys(rows):
        return [(int(q), rows["image"][i].tobytes()) for i, q in enumerate(rows["question_group"])]

    shards = [keys(_concat(_batches(create_dataset(small_cfg, "test", rank_id=r, rank_size=2)))) for r in (0, 1)]
    everything = keys(split_rows_of_test)
    assert len(set(everything)) == len(everything)
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(everything)
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_a_missing_data_root_says_how_to_build_it(small_cfg, tmp_path):
    cfg = dataclasses.replace(small_cfg, data=dataclasses.replace(small_cfg.data, root=str(tmp_path / "nothing")))
    with pytest.raises(DataRootError, match="mindvl data build --config"):
        create_dataset(cfg, "train")
