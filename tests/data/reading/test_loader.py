import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl import preprocess as P
from mindvl.data import COLUMNS, create_dataset, load_meta, load_tokenizer
from mindvl.errors import ConfigError, DataRootError
from mindvl.data.reading.loader import TRAIN_COLUMNS, sample_sizes, split_inputs
from mindvl.data.reading.order import data_parallel_context, epoch_order, global_batches, micro_batch_size
from mindvl.data.reading.stream import TrainStream
from mindvl.data.reading.packing import PACK_COLUMNS, FusionLayout
from mindvl.data.records import read_table


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
    expected = {"sample_id": ("int64", (4,)), "image": ("float32", (4, 3, S, S)), "question_ids": ("int32", (4, Lt)),
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


def test_sample_sizes_are_the_lengths_the_pipeline_produces(small_cfg, split_rows_of_test):
    """The packer's buckets are sized from these, read without decoding anything: they must agree."""
    sizes = sample_sizes(small_cfg, "test")
    rows = split_rows_of_test
    np.testing.assert_array_equal(sizes.question_tokens, rows["question_mask"].sum(1))
    np.testing.assert_array_equal(sizes.caption_tokens, rows["caption_mask"].sum(1))
    for frames, mask in zip(sizes.clip_frames, rows["audio_mask"]):
        assert mask.sum() in frames  # the clip the pipeline spoke is one of the question's clips


def test_test_split_is_deterministic_and_train_audio_changes_between_epochs(small_cfg, split_rows_of_test):
    again = _concat(_batches(create_dataset(small_cfg, "test")))
    for name in COLUMNS:
        np.testing.assert_array_equal(again[name], split_rows_of_test[name])
    epochs = [_concat(_batches(create_dataset(small_cfg, "train", shuffle=False, drop_remainder=False, epoch=e)))
              for e in (0, 1)]
    np.testing.assert_array_equal(epochs[0]["question_group"], epochs[1]["question_group"])
    changed = np.any(epochs[0]["audio_mel"] != epochs[1]["audio_mel"], axis=(1, 2))
    assert changed.mean() > 0.2  # two training voices: about half the rows hear the other one
    assert np.any(epochs[0]["image"] != epochs[1]["image"], axis=(1, 2, 3)).mean() > 0.5  # augmentation


def test_augmentation_is_train_only_and_can_be_switched_off(make_config, small_cfg, small_report):
    plain = make_config(small_cfg.data.root, data__augment__enabled="false")
    rows = _concat(_batches(create_dataset(plain, "train", shuffle=False, drop_remainder=False)))
    table = {int(r["sample_id"]): r["image"] for r in read_table(small_cfg.data.root + "/train.mindrecord",
                                                                   ["sample_id", "image"])}
    for i, sample_id in enumerate(rows["sample_id"][:5]):
        np.testing.assert_array_equal(rows["image"][i], P.decode_image(table[int(sample_id)], plain.preprocess))
    augmented = _concat(_batches(create_dataset(small_cfg, "train", shuffle=False, drop_remainder=False)))
    assert np.any(augmented["image"] != rows["image"])
    np.testing.assert_array_equal(augmented["sample_id"], rows["sample_id"])


def test_question_modality_flags(small_cfg, small_report):
    for modality, flags in {"text": (1, 0), "audio": (0, 1), "both": (1, 1)}.items():
        rows = _concat(_batches(create_dataset(small_cfg, "test", question_modality=modality)))
        assert set(zip(rows["use_text"], rows["use_audio"])) == {flags}
    mixed = _concat(_batches(create_dataset(small_cfg, "train")))
    assert set(zip(mixed["use_text"], mixed["use_audio"])) == {(1, 0), (0, 1), (1, 1)}


def test_two_ranks_read_disjoint_shards_that_cover_the_split(small_cfg, split_rows_of_test):
    shards = [_concat(_batches(create_dataset(small_cfg, "test", shard_id=r, num_shards=2)))["sample_id"].tolist()
              for r in (0, 1)]
    everything = split_rows_of_test["sample_id"].tolist()
    assert len(set(everything)) == len(everything)
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(everything)
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_training_shards_are_equal_disjoint_and_reshuffled_each_epoch():
    count = 103
    for epoch in (0, 1):
        parts = [epoch_order(count, 7, epoch, True, r, 3) for r in range(3)]
        assert {len(p) for p in parts} == {count // 3}  # equal steps on every rank: no collective hangs
        joined = np.concatenate(parts)
        assert len(set(joined.tolist())) == len(joined) == count - count % 3
    assert not np.array_equal(epoch_order(count, 7, 0, True, 0, 3), epoch_order(count, 7, 1, True, 0, 3))


def test_shard_defaults_to_a_single_rank_without_communication():
    assert data_parallel_context() == (0, 1)
    assert data_parallel_context(1, 2) == (1, 2)
    with pytest.raises(ValueError, match="shard_id=2, num_shards=2"):
        data_parallel_context(2, 2)


def _stream_batches(stream, count):
    out = []
    for sample_ids, batch in stream:
        out.append((sample_ids, [t.asnumpy() for t in batch]))
        if len(out) == count:
            return out
    return out


def test_resumed_stream_yields_exactly_the_uninterrupted_batches(make_config, small_cfg, small_report):
    two_workers = make_config(small_cfg.data.root, data__num_workers=2)
    uninterrupted = TrainStream(two_workers)
    steps = uninterrupted.steps_per_epoch
    total = steps + 3  # crosses an epoch boundary
    reference = _stream_batches(uninterrupted, total)
    one_worker = make_config(small_cfg.data.root, data__num_workers=1)
    for stop in (2, steps):  # mid-epoch and exactly at the end of an epoch
        first = TrainStream(one_worker)
        head = _stream_batches(first, stop)
        state = first.state()
        assert state["epoch"] * steps + state["batch"] == stop
        assert state["samples"] == stop * small_cfg.data.batch_size
        tail = _stream_batches(TrainStream(one_worker, state=state), total - stop)
        resumed = head + tail
        assert [ids.tolist() for ids, _ in resumed] == [ids.tolist() for ids, _ in reference]
        for (_, got), (_, want) in zip(resumed, reference):
            for name, a, b in zip(TRAIN_COLUMNS, got, want):
                np.testing.assert_array_equal(a, b, err_msg=name)


def test_a_stream_refuses_a_state_it_cannot_reproduce(make_config, small_cfg, small_report):
    state = TrainStream(small_cfg).state()
    other = make_config(small_cfg.data.root, data__batch_size=4)
    with pytest.raises(Exception, match="batch_size is 8 but this run has 4"):
        TrainStream(other, state=state)


def test_train_batches_carry_a_consistent_packed_layout(small_cfg, small_report):
    stream = TrainStream(small_cfg)
    layout = FusionLayout.from_config(small_cfg)
    sample_ids, batch = next(iter(stream))
    columns = dict(zip(TRAIN_COLUMNS, (t.asnumpy() for t in batch)))
    index, segment = columns["pack_index"], columns["pack_segment"]
    assert index.shape[1] == small_cfg.data.packing.length
    assert np.all(index.reshape(-1)[columns["cls_index"]] == np.arange(len(sample_ids)) * layout.length)
    assert set(PACK_COLUMNS) <= set(TRAIN_COLUMNS)
    assert (segment > 0).sum() < len(sample_ids) * layout.length  # packing leaves out unused slots


def test_packed_text_and_audio_columns_hold_the_batchs_valid_tokens_and_frames(small_cfg, small_report):
    batch = next(iter(create_dataset(small_cfg, "train", packed=True).create_dict_iterator(num_epochs=1,
                                                                                          output_numpy=True)))
    pre, packing = small_cfg.preprocess, small_cfg.data.packing
    assert batch["text_pack_ids"].shape[1] == packing.text_length
    assert batch["audio_pack_mel"].shape[1:] == (pre.n_mels, packing.audio_frames)
    flat_ids = np.concatenate((batch["text_pack_ids"].reshape(-1), [0]))  # + the zero row
    texts = np.concatenate((batch["question_ids"], batch["caption_ids"]))
    masks = np.concatenate((batch["question_mask"], batch["caption_mask"]))
    np.testing.assert_array_equal(flat_ids[batch["text_index"]], texts * masks)
    assert (batch["audio_pack_segment"] > 0).sum() == batch["audio_mask"].sum()  # every valid frame, once
    mel = batch["audio_pack_mel"].transpose(0, 2, 1).reshape(-1, pre.n_mels)  # (rows * frames, n_mels)
    for b in range(len(batch["sample_id"])):
        start = 2 * batch["audio_index"][b, 0]  # flat token r * T/2 + i sits on flat frame r * T + 2i
        frames = int(batch["audio_mask"][b].sum())
        np.testing.assert_array_equal(mel[start:start + frames], batch["audio_mel"][b, :, :frames].T)


def test_a_missing_data_root_says_how_to_build_it(small_cfg, tmp_path):
    cfg = dataclasses.replace(small_cfg, data=dataclasses.replace(small_cfg.data, root=str(tmp_path / "nothing")))
    with pytest.raises(DataRootError, match="mindvl data build --config"):
        create_dataset(cfg, "train")


# ----------------------------------------------------------------------------- global batches

def _step_rows(stream, steps):
    """Sample ids of the first `steps` optimizer steps: one list per step, this rank's micro-batches in order."""
    micro = _stream_batches(stream, steps * stream.accumulation)
    return [[i for ids, _ in micro[s * stream.accumulation:(s + 1) * stream.accumulation] for i in ids.tolist()]
            for s in range(steps)]


def test_every_split_of_a_global_batch_reads_exactly_that_steps_rows():
    order = np.random.default_rng(0).permutation(103)
    for workers, accumulation in ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2)):
        steps = global_batches(order, 8, workers, accumulation)  # (steps, accumulation, workers, micro)
        assert steps.shape == (103 // 8, accumulation, workers, 8 // (workers * accumulation))
        for b, step in enumerate(steps):
            rows = step.reshape(-1).tolist()
            assert len(set(rows)) == len(rows) == 8  # disjoint chunks
            assert set(rows) == set(order[b * 8:(b + 1) * 8].tolist())  # the same samples per optimizer step
            micro = 8 // (workers * accumulation)
            for m in range(accumulation):
                for r in range(workers):  # micro-batch m of rank r: chunk m * workers + r of the step
                    start = b * 8 + (m * workers + r) * micro
                    np.testing.assert_array_equal(step[m, r], order[start:start + micro])
    gathered = global_batches(order, 8, 2, 1)[:, 0].reshape(-1, 8)  # rank 0's rows, then rank 1's
    np.testing.assert_array_equal(gathered, order[:96].reshape(-1, 8))


def test_two_workers_and_accumulation_stream_the_single_workers_global_batches(make_config, small_cfg,
                                                                               small_report):
    single = TrainStream(small_cfg)  # data.batch_size 8: one worker, one micro-batch of 8
    ranks = [TrainStream(small_cfg, shard_id=r, num_shards=2) for r in (0, 1)]
    accumulating = TrainStream(make_config(small_cfg.data.root, train__grad_accumulation=2))
    assert (single.micro_batch_size, ranks[0].micro_batch_size, accumulating.micro_batch_size) == (8, 4, 4)
    assert (ranks[0].accumulation, accumulating.accumulation) == (1, 2)
    examples = small_cfg_examples(small_cfg, "train")
    assert {s.steps_per_epoch for s in (single, *ranks, accumulating)} == {examples // 8}  # optimizer steps
    want = _step_rows(single, 2)
    halves = [_step_rows(rank, 2) for rank in ranks]
    assert [a + b for a, b in zip(*halves)] == want  # gathered in rank order: the single worker's batch
    assert all(set(a).isdisjoint(b) for a, b in zip(*halves))
    assert _step_rows(accumulating, 2) == want
    assert single.state()["samples"] == ranks[0].state()["samples"] == accumulating.state()["samples"] == 16


def test_a_global_batch_that_does_not_split_evenly_names_the_nearest_valid_sizes(make_config, small_cfg,
                                                                                 small_report):
    assert micro_batch_size(64, 2, 4) == 8
    with pytest.raises(ConfigError, match=r"data.batch_size: 10 .* 2 worker\(s\) x train.grad_accumulation=3 "
                                          r".* set data.batch_size to 6 or 12"):
        micro_batch_size(10, 2, 3)
    with pytest.raises(ConfigError, match="set data.batch_size to 8, or change train.grad_accumulation"):
        micro_batch_size(4, 2, 4)  # 0 is not a batch size
    with pytest.raises(ConfigError, match="set data.batch_size to 4 or 8"):
        TrainStream(make_config(small_cfg.data.root, data__batch_size=6, train__grad_accumulation=4))


def test_resume_mid_accumulation_and_after_an_optimizer_step_continues_exactly(make_config, small_cfg,
                                                                               small_report):
    cfg = make_config(small_cfg.data.root, train__grad_accumulation=2)
    reference = [ids.tolist() for ids, _ in _stream_batches(TrainStream(cfg), 6)]
    for stop, position in ((3, (1, 1)), (4, (2, 0))):  # micro-batches consumed -> (steps, micro)
        first = TrainStream(cfg)
        head = [ids.tolist() for ids, _ in _stream_batches(first, stop)]
        state = first.state()
        assert (state["batch"], state["micro"], state["samples"]) == (*position, stop * 4)
        tail = [ids.tolist() for ids, _ in _stream_batches(TrainStream(cfg, state=state), 6 - stop)]
        assert head + tail == reference


def test_a_stream_refuses_a_state_with_another_accumulation_hold_out_or_layout(make_config, small_cfg,
                                                                                small_report):
    state = TrainStream(small_cfg).state()
    with pytest.raises(ConfigError, match="accumulation is 1 but this run has 2 \\(train.grad_accumulation\\)"):
        TrainStream(make_config(small_cfg.data.root, train__grad_accumulation=2), state=state)
    with pytest.raises(ConfigError, match="validation_fraction is 0.0 but this run has 0.25"):
        TrainStream(make_config(small_cfg.data.root, data__validation_fraction=0.25), state=state)
    old = {k: v for k, v in state.items() if k not in ("accumulation", "micro", "validation_fraction")}
    TrainStream(small_cfg, state=old)  # a single-rank state from before global batches: the same order
    with pytest.raises(ConfigError, match="contiguous share of the epoch"):
        TrainStream(small_cfg, shard_id=0, num_shards=2, state={**old, "num_shards": 2})
    assert TrainStream(small_cfg, shard_id=1, num_shards=2, state=TrainStream(small_cfg, shard_id=0,
                                                                               num_shards=2).state())


# ----------------------------------------------------------------------------- validation hold-out

def test_validation_holds_out_whole_images_that_training_never_reads(make_config, small_cfg, small_report):
    cfg = make_config(small_cfg.data.root, data__validation_fraction=0.25)
    image_of = [int(r["image_id"]) for r in read_table(small_cfg.data.root + "/train.mindrecord", ["image_id"])]
    validation = _concat(_batches(create_dataset(cfg, "validation")))
    held = sorted(validation["sample_id"].tolist())
    held_images = {image_of[i] for i in held}
    assert len(held_images) == 2  # a quarter of the 8 training images
    assert held == [i for i, image in enumerate(image_of) if image in held_images]  # every question of them
    stream = TrainStream(cfg)
    assert sorted(stream.rows.tolist() + held) == list(range(len(image_of)))
    assert stream.steps_per_epoch == len(stream.rows) // 8
    read = {i for epoch in (0, 1) for i in stream.epoch_rows(epoch).reshape(-1).tolist()}
    assert read.isdisjoint(held) and len(read) >= len(stream.rows) - 7  # all but a dropped remainder
    again = _concat(_batches(create_dataset(cfg, "validation")))  # fixed order, no augmentation
    np.testing.assert_array_equal(again["image"], validation["image"])
    frames = sample_sizes(cfg, "validation").clip_frames  # spoken in the training voices
    assert all(mask.sum() in clips for mask, clips in zip(validation["audio_mask"], frames))
    assert len(split_inputs(cfg, "validation")[0]) == 2  # the encoders see the held-out images only
    other_seed = make_config(small_cfg.data.root, data__validation_fraction=0.25, data__seed=1)
    assert TrainStream(other_seed).rows.tolist() != stream.rows.tolist()


def test_validation_without_a_fraction_says_how_to_get_one(small_cfg, small_report):
    with pytest.raises(ConfigError, match="set data.validation_fraction"):
        create_dataset(small_cfg, "validation")
