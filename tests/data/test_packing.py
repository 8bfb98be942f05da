import numpy as np
import pytest

from mindvl.config import ConfigError
from mindvl.data.packing import FusionLayout, Packer, PackingStats, first_fit_decreasing

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


def test_first_fit_decreasing_fills_bins_without_overflow():
    sizes = [7, 3, 9, 2, 5, 5, 1]
    bins = first_fit_decreasing(sizes, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # 32 units need at least 4 bins of 10
    assert bins == first_fit_decreasing(sizes, 10)  # deterministic


def test_used_slots_follow_masks_and_modality():
    qmask = np.array([1, 1, 1, 0, 0, 0], np.float32)
    amask = np.array([1] * 5 + [0] * 11, np.float32)  # 5 frames -> tokens at frames 0, 2, 4
    prefix, answer = LAYOUT.used_slots(qmask, amask, 1.0, 0.0)
    assert prefix.tolist() == list(range(6)) + [6, 7, 8]
    prefix, _ = LAYOUT.used_slots(qmask, amask, 0.0, 1.0)
    assert prefix.tolist() == list(range(6)) + [12, 13, 14]
    assert answer.tolist() == [20, 21, 22]


def test_packed_layout_holds_every_used_slot_once_in_order():
    rng = np.random.default_rng(0)
    inputs = _batch(rng, 12)
    packer = Packer(LAYOUT, 12, enabled=True, length=48, rows=[4, 6])
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
    roomy = Packer(LAYOUT, 12, enabled=True, length=48, rows=[2, 5, 8])
    need = len(first_fit_decreasing([sum(map(len, LAYOUT.used_slots(*(x[b] for x in inputs)))) for b in range(12)], 48))
    assert roomy(*inputs).arrays[0].shape[0] == min(r for r in roomy.rows if r >= need)
    tight = Packer(LAYOUT, 12, enabled=True, length=48, rows=[1])
    assert tight.rows == [1, 12] and tight(*inputs).arrays[0].shape[0] == 12
    assert roomy.shapes() == [(2, 48), (5, 48), (8, 48), (12, 48)]


def test_disabled_packing_is_the_padded_layout():
    rng = np.random.default_rng(2)
    inputs = _batch(rng, 4)
    packed = Packer(LAYOUT, 4, enabled=False)(*inputs)
    index, segment, answer_flag, cls_index, answer_index = packed.arrays
    assert index.shape == (4, LAYOUT.length)
    np.testing.assert_array_equal(index.reshape(-1), np.arange(4 * LAYOUT.length))
    np.testing.assert_array_equal(cls_index, np.arange(4) * LAYOUT.length)
    for b in range(4):
        prefix, answer = LAYOUT.used_slots(*(x[b] for x in inputs))
        assert set(np.flatnonzero(segment[b])) == set(prefix) | set(answer)


def test_a_row_shorter_than_the_longest_sample_is_a_config_error():
    with pytest.raises(ConfigError, match="data.packing.length: 16 .* at least 23"):
        Packer(LAYOUT, 8, enabled=True, length=16)


def test_packing_stats_report_fill_and_buckets():
    stats = PackingStats()
    segment = np.array([[1, 1, 2, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.int32)
    stats.add(segment, 3)
    summary = stats.summary()
    assert summary["fill"] == pytest.approx(4 / 12, abs=1e-4)
    assert summary["samples_per_row"] == pytest.approx(1.5)
    assert summary["row_buckets"] == {3: 1}
