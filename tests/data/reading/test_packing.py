import numpy as np
import pytest

from mindvl.errors import ConfigError
from mindvl.config import load_config
from mindvl.data.reading.packing import (PACK_COLUMNS, PACK_INPUTS, AudioPacker, FusionLayout, FusionPacker, Packer,
                                 PackingStats, SampleSizes, TextPacker, calibrate_rows, pack_rows)

LAYOUT = FusionLayout(image_tokens=5, text_tokens=6, audio_tokens=8, answer_tokens=3)  # 1 + 5 + 6 + 8 + 3 = 23


def _batch(rng, batch):
    question_mask = np.zeros((batch, 6), np.float32)
    audio_mask = np.zeros((batch, 16), np.float32)
    for b in range(batch):
        question_mask[b, :rng.integers(3, 7)] = 1
        audio_mask[b, :rng.integers(4, 17)] = 1
    flags = rng.integers(0, 3, batch)  # 0 text, 1 audio, 2 both
    use_text = (flags != 1).astype(np.float32)
    use_audio = (flags != 0).astype(np.float32)
    return question_mask, audio_mask, use_text, use_audio


def _prefix_masks(lengths, width):
    return (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.float32)


def test_pack_rows_fills_rows_without_overflow():
    sizes = [7, 3, 9, 2, 5, 5, 1]
    rows = pack_rows(sizes, 10)
    assert sorted(i for r in rows for i in r) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in r) <= 10 for r in rows)
    assert len(rows) == 4  # 32 units need at least 4 rows of 10
    assert rows == pack_rows(sizes, 10)  # deterministic


def test_pack_rows_needs_fewer_rows_than_first_fit_decreasing():
    # first-fit decreasing: [5, 4], [4, 3, 2], [2] -> 3 rows; the best subset per row: [5, 3, 2], [4, 4, 2]
    assert pack_rows([3, 2, 4, 2, 5, 4], 10) == [[0, 1, 4], [2, 3, 5]]


def test_pack_rows_leaves_each_items_gap_before_the_next_item():
    # 4 + gap 1 leaves room for 5 in a row of 10 (the gapped 4 goes last); 5 + gap 1 leaves 4, not 5;
    # the gap after a row's last item costs nothing
    assert pack_rows([4, 5], 10, gaps=[1, 0]) == [[1, 0]]
    assert pack_rows([5, 5], 10, gaps=[1, 1]) == [[0], [1]]
    assert pack_rows([5, 4], 10, gaps=[1, 1]) == [[0, 1]]
    assert pack_rows([10], 10, gaps=[1]) == [[0]]
    rng = np.random.default_rng(2)
    for _ in range(50):
        sizes, gaps = rng.integers(1, 11, 12).tolist(), rng.integers(0, 2, 12).tolist()
        for row in pack_rows(sizes, 10, gaps):
            assert sum(sizes[i] + gaps[i] for i in row[:-1]) + sizes[row[-1]] <= 10
            assert all(gaps[i] == 0 for i in row[:-1]) or gaps[row[-1]] == 1  # a gapped item ends the row


def test_used_slots_follow_masks_and_modality():
    qmask = np.array([1, 1, 1, 0, 0, 0], np.float32)
    amask = np.array([1] * 5 + [0] * 11, np.float32)  # 5 frames -> tokens at frames 0, 2, 4
    prefix, answer = LAYOUT.used_slots(qmask, amask, 1.0, 0.0)
    assert prefix.tolist() == list(range(6)) + [6, 7, 8]
    prefix, _ = LAYOUT.used_slots(qmask, amask, 0.0, 1.0)
    assert prefix.tolist() == list(range(6)) + [12, 13, 14]
    assert answer.tolist() == [20, 21, 22]


def test_slot_counts_from_lengths_equal_the_used_slots_from_masks():
    inputs = _batch(np.random.default_rng(7), 40)
    question_mask, audio_mask, use_text, use_audio = inputs
    sizes = LAYOUT.size(question_mask.sum(1).astype(int), audio_mask.sum(1).astype(int), use_text, use_audio)
    expected = [sum(map(len, LAYOUT.used_slots(*(x[b] for x in inputs)))) for b in range(40)]
    np.testing.assert_array_equal(sizes, expected)


def test_packed_layout_holds_every_used_slot_once_in_order():
    rng = np.random.default_rng(0)
    inputs = _batch(rng, 12)
    packer = FusionPacker(LAYOUT, 12, enabled=True, length=48, rows=[4, 6])
    packed = packer(*inputs)
    index, segment, answer_flag, cls_index, answer_index = packed.arrays
    assert index.shape[0] in (4, 6, 12) and index.shape[1] == 48
    flat_index, flat_segment = index.reshape(-1), segment.reshape(-1)
    for b in range(12):
        prefix, answer = LAYOUT.used_slots(*(x[b] for x in inputs))
        expected = b * LAYOUT.length + np.concatenate((prefix, answer))
        start = cls_index[b]
        got = flat_index[start:start + len(expected)]
        np.testing.assert_array_equal(got, expected)  # contiguous, CLS first, answer last
        row = start // 48
        assert len(set(flat_segment[start:start + len(expected)])) == 1 and flat_segment[start] > 0
        assert start // 48 == (start + len(expected) - 1) // 48 == row  # never split across rows
        np.testing.assert_array_equal(flat_index[answer_index[b]], b * LAYOUT.length + answer)
        assert answer_flag.reshape(-1)[answer_index[b]].tolist() == [1.0] * 3
    assert packed.useful_tokens == int((segment > 0).sum())
    assert packed.fill > 0.5


def test_the_smallest_bucket_that_holds_the_batch_is_used_and_batch_rows_are_the_fallback():
    rng = np.random.default_rng(1)
    inputs = _batch(rng, 12)
    roomy = FusionPacker(LAYOUT, 12, enabled=True, length=48, rows=[2, 5, 8])
    need = len(pack_rows([sum(map(len, LAYOUT.used_slots(*(x[b] for x in inputs)))) for b in range(12)], 48))
    assert roomy(*inputs).arrays[0].shape[0] == min(r for r in roomy.rows if r >= need)
    tight = FusionPacker(LAYOUT, 12, enabled=True, length=48, rows=[1])
    assert tight.rows == [1, 12] and tight(*inputs).arrays[0].shape[0] == 12
    assert roomy.shapes() == [(2, 48), (5, 48), (8, 48), (12, 48)]


def test_disabled_packing_is_the_padded_layout():
    rng = np.random.default_rng(2)
    inputs = _batch(rng, 4)
    packed = FusionPacker(LAYOUT, 4, enabled=False)(*inputs)
    index, segment, answer_flag, cls_index, answer_index = packed.arrays
    assert index.shape == (4, LAYOUT.length)
    np.testing.assert_array_equal(index.reshape(-1), np.arange(4 * LAYOUT.length))
    np.testing.assert_array_equal(cls_index, np.arange(4) * LAYOUT.length)
    for b in range(4):
        prefix, answer = LAYOUT.used_slots(*(x[b] for x in inputs))
        assert set(np.flatnonzero(segment[b])) == set(prefix) | set(answer)


def test_a_row_shorter_than_the_longest_sample_is_a_config_error():
    with pytest.raises(ConfigError, match="data.packing.length: 16 .* at least 23"):
        FusionPacker(LAYOUT, 8, enabled=True, length=16)
    with pytest.raises(ConfigError, match="data.packing.text_length: 10 .* at least 14"):
        TextPacker(14, 8, enabled=True, length=10)
    with pytest.raises(ConfigError, match="data.packing.audio_frames: .* at least .*=128, got 100"):
        AudioPacker(128, 8, enabled=True, frames=100)
    with pytest.raises(ConfigError, match="data.packing.audio_frames: expected an even number"):
        load_config("tiny", ["data.packing.audio_frames=257"])


# ------------------------------------------------------------------------------------------ text

TEXT_LENGTHS = [9, 14, 5, 7, 3, 12, 4, 14, 5, 5, 6, 5]


def _texts(lengths, width=14):
    mask = _prefix_masks(lengths, width)
    ids = (np.arange(1, width + 1)[None] * 100 + np.arange(len(lengths))[:, None] + 1) * mask  # unique per token
    return ids.astype(np.int32), mask


def test_packed_text_rows_hold_every_token_once_with_positions_restarting_per_text():
    ids, mask = _texts(TEXT_LENGTHS)
    packer = TextPacker(14, len(TEXT_LENGTHS), enabled=True, length=32, rows=[3, 4, 5])
    packed = packer(ids, mask)
    out_ids, positions, segment, index = packed.arrays
    rows = out_ids.shape[0]
    assert out_ids.shape[1] == 32 and rows == 3  # 89 tokens in 3 rows of 32
    flat = {"ids": out_ids.reshape(-1), "positions": positions.reshape(-1), "segment": segment.reshape(-1)}
    for n, length in enumerate(TEXT_LENGTHS):
        slots = index[n, :length]
        np.testing.assert_array_equal(flat["ids"][slots], ids[n, :length])  # [CLS] ... [SEP], in order
        np.testing.assert_array_equal(slots, slots[0] + np.arange(length))  # contiguous
        assert slots[0] // 32 == slots[-1] // 32  # never split across rows
        np.testing.assert_array_equal(flat["positions"][slots], np.arange(length))  # restarts at 0
        assert len(set(flat["segment"][slots])) == 1 and flat["segment"][slots[0]] > 0
        assert np.all(index[n, length:] == rows * 32)  # missing slots read the zero row
    assert (segment > 0).sum() == sum(TEXT_LENGTHS) == packed.useful_tokens
    assert np.all(out_ids[segment == 0] == 0) and np.all(positions[segment == 0] == 0)
    for r in range(rows):  # segments number the texts of a row 1, 2, ... in row order
        used = segment[r][segment[r] > 0]
        assert used.tolist() == sorted(used.tolist()) and set(used) == set(range(1, used.max() + 1))


def test_text_falls_back_to_the_padded_layout_when_no_bucket_holds_the_batch():
    ids, mask = _texts(TEXT_LENGTHS)
    tight = TextPacker(14, len(TEXT_LENGTHS), enabled=True, length=32, rows=[2])
    disabled = TextPacker(14, len(TEXT_LENGTHS), enabled=False)
    assert tight.shapes() == [(2, 32), (12, 14)] and disabled.shapes() == [(12, 14)]
    for packer in (tight, disabled):
        out_ids, positions, segment, index = packer(ids, mask).arrays
        np.testing.assert_array_equal(out_ids, ids)  # text n alone in row n
        np.testing.assert_array_equal(segment, mask.astype(np.int32))
        np.testing.assert_array_equal(positions, np.arange(14)[None] * mask)
        np.testing.assert_array_equal(index, np.where(mask > 0, np.arange(12 * 14).reshape(12, 14), 12 * 14))


# ------------------------------------------------------------------------------------------ audio

FRAME_COUNTS = [20, 128, 61, 1, 101, 8, 2, 127, 126, 3]


def _clips(frames, max_frames=128, mels=3):
    mask = _prefix_masks(frames, max_frames)
    mel = (np.arange(1, max_frames + 1)[None, None] + 1000 * np.arange(len(frames))[:, None, None]
           + np.arange(mels)[None, :, None] * 0.25) * mask[:, None]  # every frame of every clip differs
    return mel.astype(np.float32), mask


def _assert_audio_layout(packed, mel, frame_counts):
    """Every clip whole in one row at an even frame, a zero frame (or the row's end) after it, its tokens
    indexed in order with positions restarting at 0, nothing but clips' frames in the rows."""
    out_mel, segment, positions, index = packed.arrays
    rows, frames = segment.shape
    tokens = frames // 2
    assert out_mel.shape == (rows, mel.shape[1], frames) and positions.shape == (rows, tokens)
    for b, f in enumerate(frame_counts):
        n = (f + 1) // 2
        slots = index[b, :n]
        r, first = divmod(int(slots[0]), tokens)
        offset = 2 * first
        np.testing.assert_array_equal(slots, r * tokens + first + np.arange(n))  # token i of clip <-> frame 2i
        assert offset + f <= frames  # never split across rows
        np.testing.assert_array_equal(out_mel[r, :, offset:offset + f], mel[b, :, :f])
        seg = segment[r, offset]
        assert seg > 0 and np.all(segment[r, offset:offset + f] == seg)
        assert offset == 0 or segment[r, offset - 1] == 0  # a zero frame before it too
        if offset + f < frames:  # a zero frame follows the clip
            assert segment[r, offset + f] == 0 and np.all(out_mel[r, :, offset + f] == 0)
        np.testing.assert_array_equal(positions[r, first:first + n], np.arange(n))  # restart per clip
        np.testing.assert_array_equal(segment[r, ::2][first:first + n], seg)  # the clip's tokens are its segment
        assert np.all(index[b, n:] == rows * tokens)  # missing slots read the zero row
    assert np.all(out_mel.transpose(1, 0, 2)[:, segment == 0] == 0)
    assert packed.useful_tokens == (segment[:, ::2] > 0).sum() == sum((f + 1) // 2 for f in frame_counts)
    assert (segment > 0).sum() == sum(frame_counts)


def test_packed_clips_start_at_even_frames_with_a_zero_frame_after_each_and_are_never_split():
    mel, mask = _clips(FRAME_COUNTS)
    packed = AudioPacker(128, len(FRAME_COUNTS), enabled=True, frames=256, rows=[4, 5, 6])(mel, mask)
    assert packed.shape == (4, 256)  # 353 tokens and gaps in 4 rows of 128 tokens
    _assert_audio_layout(packed, mel, FRAME_COUNTS)
    rng = np.random.default_rng(5)
    for _ in range(30):  # odd and even clips in every mix, rows filled to the last frame
        counts = rng.integers(1, 129, 16).tolist()
        mel, mask = _clips(counts, mels=1)
        packed = AudioPacker(128, 16, enabled=True, frames=256, rows=[8, 10, 12])(mel, mask)
        assert packed.shape[1] == 256
        _assert_audio_layout(packed, mel, counts)


def test_audio_falls_back_to_the_padded_layout_when_no_bucket_holds_the_batch():
    mel, mask = _clips(FRAME_COUNTS)
    for packer in (AudioPacker(128, 10, enabled=True, frames=256, rows=[2]), AudioPacker(128, 10, enabled=False)):
        out_mel, segment, positions, index = packer(mel, mask).arrays
        np.testing.assert_array_equal(out_mel, mel)
        np.testing.assert_array_equal(segment, mask.astype(np.int32))
        token_mask = mask[:, ::2] > 0
        np.testing.assert_array_equal(positions, np.where(token_mask, np.arange(64)[None], 0))
        np.testing.assert_array_equal(index, np.where(token_mask, np.arange(10 * 64).reshape(10, 64), 10 * 64))


def test_masks_that_are_not_prefixes_are_refused():
    mel, mask = _clips([4, 6])
    mask[0, 1] = 0
    with pytest.raises(ValueError, match="valid entries come first"):
        AudioPacker(128, 2, frames=256)(mel, mask)


# ------------------------------------------------------------------------------------------ together

def test_the_packer_emits_every_column_from_the_loaders_columns():
    cfg = load_config("tiny", ["data.batch_size=4"])
    pre = cfg.preprocess
    rng = np.random.default_rng(3)
    question_ids, question_mask = _texts([9, 14, 5, 7])
    caption_ids, caption_mask = _texts([5, 5, 6, 3])
    mel, audio_mask = _clips([60, 128, 33, 90], pre.max_audio_frames, pre.n_mels)
    columns = dict(question_ids=question_ids, question_mask=question_mask, caption_ids=caption_ids,
                   caption_mask=caption_mask, audio_mel=mel, audio_mask=audio_mask,
                   use_text=np.array([1, 0, 1, 1], np.float32), use_audio=np.array([0, 1, 1, 1], np.float32))
    packer = Packer.from_config(cfg)
    packed = packer(*(columns[name] for name in PACK_INPUTS))
    arrays = dict(zip(PACK_COLUMNS, packed.arrays))
    assert len(packed.arrays) == len(PACK_COLUMNS)
    assert arrays["text_index"].shape == (8, pre.max_text_length)  # questions, then captions
    assert arrays["audio_index"].shape == (4, pre.max_audio_frames // 2)
    assert arrays["text_pack_ids"].shape[1] == cfg.data.packing.text_length
    assert arrays["audio_pack_mel"].shape[1:] == (pre.n_mels, cfg.data.packing.audio_frames)
    flat_ids = arrays["text_pack_ids"].reshape(-1)
    np.testing.assert_array_equal(flat_ids[arrays["text_index"][4, :5]], caption_ids[0, :5])
    assert packed.shapes == (packed.text.shape, packed.audio.shape, packed.fusion.shape)
    shapes = packer.shapes()
    assert packed.text.shape in shapes["text"] and packed.audio.shape in shapes["audio"]
    assert packed.fusion.shape in shapes["fusion"]
    del rng


def test_default_buckets_hold_a_typical_easy_vqa_batch_in_one_shape_per_stream():
    """Buckets derived from the average use hold a batch of typical lengths (questions 7-12 tokens,
    captions 5, clips 38-122 frames) in their first bucket: one graph for the common case."""
    cfg = load_config("tiny")
    batch = cfg.data.batch_size
    packer = Packer.from_config(cfg)
    rng = np.random.default_rng(4)
    for _ in range(5):
        q = rng.integers(7, 13, batch)
        f = rng.integers(38, 123, batch)
        question_ids, question_mask = _texts(q)
        caption_ids, caption_mask = _texts(np.full(batch, 5))
        mel, audio_mask = _clips(f, 128, 1)
        flags = rng.integers(0, 3, batch)
        packed = packer(question_ids, question_mask, caption_ids, caption_mask, mel, audio_mask,
                        (flags != 1).astype(np.float32), (flags != 0).astype(np.float32))
        assert packed.text.shape == packer.text.shapes()[0]
        assert packed.audio.shape == packer.audio.shapes()[0]
        assert packed.text.fill > 0.8 and packed.audio.fill > 0.7
    del rng


def test_calibrated_buckets_cover_nearly_every_batch_and_leave_headroom():
    needed = [30] * 190 + [31] * 9 + [33]
    assert calibrate_rows(needed) == [31, 37]  # the 99% quantile; the largest + 10%
    assert calibrate_rows([12] * 10) == [12, 14]


def _sizes(rng, count, question, caption, frames):
    """SampleSizes of `count` examples with token and frame counts drawn from the given ranges."""
    return SampleSizes(rng.integers(*question, count), rng.integers(*caption, count),
                       [rng.integers(*frames, 3) for _ in range(count)], (0.4, 0.4, 0.2))


def test_buckets_sized_from_the_data_hold_its_batches_and_follow_its_lengths():
    cfg = load_config("tiny")
    batch = cfg.data.batch_size
    rng = np.random.default_rng(5)
    short = _sizes(rng, 2000, (7, 13), (5, 6), (38, 123))  # easy-VQA-like
    long = _sizes(rng, 2000, (10, 15), (10, 15), (90, 128))  # a user's longer captions and clips
    packer = Packer.from_config(cfg, sizes=short)
    held = {name: 0 for name in ("text", "audio", "fusion")}
    draws = 100
    needed = packer.needed_rows(short, draws, np.random.default_rng(11))  # batches the calibration never saw
    for name in held:
        first = packer.shapes()[name][0][0]
        held[name] = np.mean(np.asarray(needed[name]) <= first)
        assert first <= max(needed[name]) + 1  # no bucket far above what the data needs
    assert min(held.values()) >= 0.95
    # a real batch drawn from those sizes packs into the first buckets
    drawn = short.draw(batch, np.random.default_rng(12))
    question_ids, question_mask = _texts(drawn["question"])
    caption_ids, caption_mask = _texts(drawn["caption"])
    mel, audio_mask = _clips(drawn["frames"], cfg.preprocess.max_audio_frames, 1)
    packed = packer(question_ids, question_mask, caption_ids, caption_mask, mel, audio_mask,
                    drawn["use_text"], drawn["use_audio"])
    shapes = packer.shapes()
    assert packed.text.fill > 0.85 and packed.fusion.fill > 0.8
    assert packed.shapes[0] in shapes["text"][:2] and packed.shapes[2] in shapes["fusion"][:2]
    longer = Packer.from_config(cfg, sizes=long).shapes()
    assert all(longer[name][0][0] > shapes[name][0][0] for name in shapes)
    # buckets the recipe names win over the data's
    fixed = load_config("tiny", ["data.packing.text_rows=[40]"])
    assert Packer.from_config(fixed, sizes=short).shapes()["text"][0] == (40, fixed.data.packing.text_length)


def test_bucket_fill_counts_the_shape_and_fill_the_packer_gives_each_drawn_batch():
    cfg = load_config("tiny", ["data.batch_size=16"])
    rng = np.random.default_rng(6)
    short = _sizes(rng, 500, (7, 13), (5, 6), (38, 123))
    long = _sizes(rng, 500, (10, 15), (10, 15), (90, 129))  # some batches overflow the short data's buckets
    packer = Packer.from_config(cfg, sizes=short)
    for seed in range(4):
        sizes = short if seed % 2 else long
        fill = packer.bucket_fill(sizes, 1, np.random.default_rng(seed))
        drawn = sizes.draw(16, np.random.default_rng(seed))  # the same batch, packed for real
        question_ids, question_mask = _texts(drawn["question"])
        caption_ids, caption_mask = _texts(drawn["caption"])
        mel, audio_mask = _clips(np.minimum(drawn["frames"], cfg.preprocess.max_audio_frames),
                                 cfg.preprocess.max_audio_frames, 1)
        packed = packer(question_ids, question_mask, caption_ids, caption_mask, mel, audio_mask,
                        drawn["use_text"], drawn["use_audio"])
        for name, stream in (("text", packed.text), ("audio", packed.audio), ("fusion", packed.fusion)):
            [taken] = [b for b in fill[name] if b["batches"]]
            assert (taken["rows"], taken["length"]) == stream.shape
            assert taken["fill"] == round(stream.fill, 4)
            assert [b["padded"] for b in fill[name]] == [False] * (len(fill[name]) - 1) + [True]


def test_packing_stats_report_fill_and_buckets():
    stats = PackingStats()
    segment = np.array([[1, 1, 2, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.int32)
    stats.add(segment, 3)
    summary = stats.summary()
    assert summary["fill"] == pytest.approx(4 / 12, abs=1e-4)
    assert summary["samples_per_row"] == pytest.approx(1.5)
    assert summary["row_buckets"] == {3: 1}
