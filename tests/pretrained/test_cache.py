"""The feature cache runs a frozen encoder (real MiniLM here) once per distinct input and settings."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindvl import from_pretrained
from mindvl.pretrained.cache import FeatureCache

SENTENCES = [b"What color is the shape?", b"Is there a circle?", b"What color is the shape?", b"Is it red?"]


@pytest.fixture(scope="module")
def embed(converted):
    """bytes sentences -> MiniLM sentence embeddings (n, 384), counting the sentences it encodes."""
    from tokenizers import Tokenizer

    ms.set_context(mode=ms.GRAPH_MODE)
    folder = converted("minilm")
    encoder = from_pretrained(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=16)

    def run(batch):
        run.encoded += len(batch)
        encodings = tokenizer.encode_batch([b.decode() for b in batch])
        ids = np.array([e.ids for e in encodings], np.int32)
        mask = np.array([e.attention_mask for e in encodings], np.float32)
        return encoder(Tensor(ids), Tensor(mask))[1].asnumpy()

    run.encoded = 0
    return folder, run


def test_each_distinct_input_is_encoded_once(embed, tmp_path):
    folder, run = embed
    run.encoded = 0
    cache = FeatureCache(tmp_path, folder, settings={"max_length": 16}, batch_size=2)
    first = cache.get_or_compute(SENTENCES, run)
    assert run.encoded == 3  # the repeated question is encoded once
    np.testing.assert_array_equal(first[0], first[2])
    again = FeatureCache(tmp_path, folder, settings={"max_length": 16}).get_or_compute(SENTENCES, run)
    assert run.encoded == 3  # a new process would read them back: nothing recomputed
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    direct = run(SENTENCES[:1])[0]
    np.testing.assert_allclose(first[0], direct, atol=2e-3)  # stored as float16


def test_other_settings_are_other_entries(embed, tmp_path):
    folder, run = embed
    FeatureCache(tmp_path, folder, settings={"max_length": 16}).get_or_compute(SENTENCES[:2], run)
    run.encoded = 0
    other = FeatureCache(tmp_path, folder, settings={"max_length": 32})
    other.get_or_compute(SENTENCES[:2], run)
    assert run.encoded == 2 and other.stats.computed == 2


def test_a_damaged_entry_is_recomputed_and_counted(embed, tmp_path):
    folder, run = embed
    cache = FeatureCache(tmp_path, folder, settings={})
    expected = cache.get_or_compute(SENTENCES[:1], run)[0]
    entry = next(tmp_path.rglob("*.npy"))
    entry.write_bytes(entry.read_bytes()[:40])  # truncated
    fresh = FeatureCache(tmp_path, folder, settings={})
    np.testing.assert_array_equal(fresh.get_or_compute(SENTENCES[:1], run)[0], expected)
    assert fresh.stats.damaged == 1 and fresh.stats.computed == 1
