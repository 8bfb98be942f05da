"""MiniLM converted into mindvl's TextEncoder computes what transformers' BertModel computes
(tests/references/ref_minilm.py), in graph mode, padded and packed."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindvl.data.reading.packing import TextPacker
from mindvl import from_pretrained

ATOL = 1e-4


@pytest.fixture(scope="module")
def encoder(converted):
    ms.set_context(mode=ms.GRAPH_MODE)
    return from_pretrained(converted("minilm"))


def _l2(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_converted_folder_records_its_source_and_checksums(converted):
    config = json.loads((converted("minilm") / "config.json").read_text())
    assert config["kind"] == "text" and config["encoder"]["pooling"] == "mean"
    assert config["parameters"] == 22_565_376  # BERT-MiniLM-L6 without the pooler
    assert set(config["files"]) == {"model.safetensors", "tokenizer.json"}
    assert all(len(digest) == 64 for digest in config["source"]["files"].values())


def test_the_copied_tokenizer_gives_the_reference_ids(converted, reference):
    from tokenizers import Tokenizer

    ref = reference("minilm")
    tokenizer = Tokenizer.from_file(str(converted("minilm") / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    ids = np.array([e.ids for e in tokenizer.encode_batch([str(s) for s in ref["sentences"]])])
    np.testing.assert_array_equal(ids, ref["ids"])
    assert ids[0, :9].tolist() == [101, 1037, 4937, 7719, 2006, 1996, 13523, 1012, 102]  # DATA.md


def test_token_states_and_sentence_embeddings_match_transformers(encoder, reference):
    ref = reference("minilm")
    states, pooled = encoder(Tensor(ref["ids"]), Tensor(ref["mask"]))
    valid = ref["mask"] > 0
    state_error = np.abs(states.asnumpy()[valid] - ref["states"][valid]).max()
    embedding_error = np.abs(_l2(pooled.asnumpy()) - ref["embeddings"]).max()
    assert state_error < ATOL, f"token states differ by {state_error:.2e}"
    assert embedding_error < ATOL, f"sentence embeddings differ by {embedding_error:.2e}"
    np.testing.assert_allclose(_l2(pooled.asnumpy())[0, :4], [0.1265, -0.0329, -0.0291, 0.0444], atol=1e-4)


def test_packed_sentences_give_the_same_embeddings(encoder, reference):
    """The training layout (several sentences per row, segment ids, positions restarting) with real weights."""
    ref = reference("minilm")
    ids, mask = ref["ids"], ref["mask"]
    packed = TextPacker(ids.shape[1], len(ids), enabled=True, length=48, rows=[4])(ids.astype(np.int32), mask)
    assert packed.shape == (4, 48)  # 8 sentences in 4 rows
    _, pooled = encoder.construct_packed(*(Tensor(a) for a in packed.arrays))
    error = np.abs(_l2(pooled.asnumpy()) - ref["embeddings"]).max()
    assert error < ATOL, f"packed sentence embeddings differ by {error:.2e}"
