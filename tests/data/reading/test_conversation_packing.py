"""Conversations packed into rows: segments and positions per conversation, modality slots pointing at their
own sample's tokens, a label for every learnt token and nothing else, buckets that refuse clearly."""
from pathlib import Path

import numpy as np
import pytest

from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, ChatEncoder, chat_template, conversation_turns
from mindvl.data.reading.conversation_packing import ConversationPacker
from mindvl.errors import InputError

TOKENIZER = Path(__file__).parents[2] / "references" / "tiny_gemma3_text" / "tokenizer.json"
IMAGE_TOKENS, AUDIO_TOKENS = 4, 2


@pytest.fixture(scope="module")
def batch():
    from tokenizers import Tokenizer

    chat = ChatEncoder(Tokenizer.from_file(str(TOKENIZER)), chat_template("plain"), IMAGE_TOKENS, AUDIO_TOKENS)
    spoken = [{"from": "human", "value": "<image>\n<audio>"}, {"from": "gpt", "value": "blue"}]
    typed = [{"from": "human", "value": "<image>\nWhat shape is it?"}, {"from": "gpt", "value": "a circle"},
             {"from": "human", "value": "And its color?"}, {"from": "gpt", "value": "red"}]
    text = [{"from": "human", "value": "Say hi"}, {"from": "gpt", "value": "hi"}]
    return [chat.render(conversation_turns(spoken), 1, 1), chat.render(conversation_turns(typed), 1, 0),
            chat.render(conversation_turns(text), 0, 0)]


def test_every_conversation_keeps_its_tokens_positions_slots_and_labels(batch):
    packer = ConversationPacker(96, [1, 2, 4], [16, 32], IMAGE_TOKENS, AUDIO_TOKENS)
    packed = packer(batch)
    rows, length, labels = packed.shape
    assert length == 96 and rows in (1, 2, 4) and labels in (16, 32)
    zero_row = len(batch) * (IMAGE_TOKENS + AUDIO_TOKENS)
    found = set()
    for r in range(rows):
        for seg in range(1, packed.segment[r].max() + 1):
            where = np.flatnonzero(packed.segment[r] == seg)
            assert np.all(np.diff(where) == 1)  # contiguous
            ids = packed.ids[r, where]
            b = next(i for i, s in enumerate(batch) if len(s) == len(where) and np.array_equal(s.ids, ids))
            found.add(b)
            sample = batch[b]
            np.testing.assert_array_equal(packed.positions[r, where], np.arange(len(where)))
            slots = packed.slot_index[r, where]
            np.testing.assert_array_equal(slots[sample.kinds == IMAGE_SLOT], b * IMAGE_TOKENS + np.arange(
                sample.count(IMAGE_SLOT)))
            np.testing.assert_array_equal(slots[sample.kinds == AUDIO_SLOT], len(batch) * IMAGE_TOKENS
                                          + b * AUDIO_TOKENS + np.arange(sample.count(AUDIO_SLOT)))
            assert np.all(slots[sample.kinds == 0] == zero_row)
    assert found == {0, 1, 2}
    # labels: every learnt token once, at the position before it, nothing else; padding weighs 0
    real = packed.label_weight > 0
    assert real.sum() == sum(int(s.learn[1:].sum()) for s in batch)
    flat_ids = packed.ids.reshape(-1)
    np.testing.assert_array_equal(packed.labels[real], flat_ids[packed.label_index[real] + 1])
    assert np.all(packed.segment.reshape(-1)[packed.label_index[real]] > 0)
    assert np.all(packed.labels[~real] == 0) and np.all(packed.label_weight[~real] == 0)
    assert np.all(flat_ids[packed.segment.reshape(-1) == 0] == 0)


def test_conversations_share_rows_when_they_fit(batch):
    packed = ConversationPacker(256, [1, 3], [32], IMAGE_TOKENS, AUDIO_TOKENS)(batch)
    assert packed.shape[0] == 1 and packed.segment.max() == 3
    assert packed.fill == pytest.approx(sum(len(s) for s in batch) / 256)


def test_the_bucket_a_batch_takes_is_the_shape_it_is_packed_into(batch):
    """ConversationPacker.bucket (the graph a batch meets, counted by benchmarks/vlm_buckets.py over an epoch)
    from sizes alone equals the packed batch's (rows, labels)."""
    learnt = sum(int(s.learn[1:].sum()) for s in batch)
    for length, rows in ((96, [1, 2, 4]), (256, [1, 3]), (64, [2, 3, 4])):
        packer = ConversationPacker(length, rows, [4, 16, 32], IMAGE_TOKENS, AUDIO_TOKENS)
        packed = packer(batch)
        assert packer.bucket([len(s) for s in batch], learnt) == (packed.shape[0], packed.shape[2])


def test_bucket_fill_counts_each_batch_in_the_shape_it_is_packed_into_and_the_share_it_fills(batch):
    """ConversationPacker.bucket_fill (the data_packing picture of a generative recipe) from sizes alone: per row
    and label bucket, the batches packed into it and their tokens (labels) over its slots, the largest marked."""
    packer = ConversationPacker(96, [1, 2, 3], [8, 16, 32], IMAGE_TOKENS, AUDIO_TOKENS)
    drawn = [batch, batch[:1], batch[1:], batch[2:], batch[::2]]
    packed = [packer(b) for b in drawn]
    fill = packer.bucket_fill([([len(s) for s in b], sum(int(s.learn[1:].sum()) for s in b)) for b in drawn])
    assert [(b["rows"], b["length"], b["padded"]) for b in fill["conversation"]] == \
        [(1, 96, False), (2, 96, False), (3, 96, True)]
    assert [(b["labels"], b["padded"]) for b in fill["labels"]] == [(8, False), (16, False), (32, True)]
    for entry in fill["conversation"]:
        into = [p for p in packed if p.shape[0] == entry["rows"]]
        assert entry["batches"] == len(into)
        assert entry["fill"] == (round(sum(p.useful_tokens for p in into) / (len(into) * entry["rows"] * 96), 4)
                                 if into else None)
    for entry in fill["labels"]:
        into = [p for p in packed if p.shape[2] == entry["labels"]]
        assert entry["batches"] == len(into)
        assert entry["fill"] == (round(sum(p.label_weight.sum() for p in into) / (len(into) * entry["labels"]), 4)
                                 if into else None)
    assert sum(b["batches"] for b in fill["labels"]) == sum(b["batches"] for b in fill["conversation"]) == len(drawn)


def test_a_batch_past_the_buckets_or_a_row_is_refused_by_name(batch):
    with pytest.raises(InputError, match=r"needs \d+ rows but the largest bucket is 1"):
        ConversationPacker(70, [1], [32], IMAGE_TOKENS, AUDIO_TOKENS)(batch)
    with pytest.raises(InputError, match=r"needs \d+ labels but the largest bucket is 2"):
        ConversationPacker(256, [4], [2], IMAGE_TOKENS, AUDIO_TOKENS)(batch)
    with pytest.raises(InputError, match="longer than a packed row"):
        ConversationPacker(8, [4], [32], IMAGE_TOKENS, AUDIO_TOKENS)(batch)
    with pytest.raises(InputError, match="4 image slots, but the model gives 5"):
        ConversationPacker(256, [4], [32], 5, AUDIO_TOKENS)(batch)
