"""A GGUF vocabulary as a SentencePiece model reads text as the tokenizer.json that transformers' GGUF builder makes
of the same vocabulary (the one `mindvl convert llm` writes): a small Gemma-layout vocabulary here; the real Gemma 3
one in tests/pretrained/test_gemma3.py."""
import pytest

from mindvl.errors import InputError
from mindvl.preprocess.sentencepiece_vocab import (BYTE, CONTROL, NORMAL, USER_DEFINED, SentencePieceVocab,
                                                    sentencepiece_model)

SPACE = "\u2581"
# Gemma's layout: control tokens first, then user-defined spellings (a newline, space runs, an HTML tag), the 256
# byte tokens and the merged pieces
CONTROL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
USER_TOKENS = ["[multimodal]", "\n", "\n\n", "  ", "   ", "<b>"]
PIECES = [SPACE, *"abcdehlortw", *"0123456789", ".", ",", "?", "!", "'", "\u00e9", f"{SPACE}h", "he", "ll", "lo",
          "hel", "hell", "hello", f"{SPACE}hello", f"{SPACE}w", "wo", "wor", "or", "ld", "rld", "world",
          f"{SPACE}world", f"{SPACE}a", f"{SPACE}the", f"{SPACE}t", "th", "the"]
STRINGS = ["hello world", " hello  world ", "hello\n\nworld\n", "tab\there", "caf\u00e9 na\u00efve \u65e5\u672c \U0001f600",
           "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n", "typed <b>bold</b> and [multimodal]",
           "<unk> <bos> <pad> <mask>", "2026-12-07, 3.14!", "", " ", "\u200b\r\n"]


def vocabulary():
    tokens = CONTROL_TOKENS + USER_TOKENS + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = ([CONTROL] * len(CONTROL_TOKENS) + [USER_DEFINED] * len(USER_TOKENS) + [BYTE] * 256
             + [NORMAL] * len(PIECES))
    scores = [0.0] * (len(tokens) - len(PIECES)) + [-float(i) for i in range(len(PIECES))]
    return tokens, scores, types


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(our SentencePieceVocab, transformers' tokenizers.Tokenizer) of one vocabulary."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokens, scores, types = vocabulary()
    model, special = sentencepiece_model(tokens, scores, types, unk_id=3)
    path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    path.write_bytes(model)
    theirs, _ = convert_gguf_tokenizer("gemma3", {
        "tokenizer_type": "llama", "tokens": tokens, "scores": scores, "token_type": types, "bos_token_id": 2,
        "eos_token_id": 1, "unk_token_id": 3, "pad_token_id": 0, "add_prefix_space": False})
    return SentencePieceVocab(path, 2, special), theirs


def test_the_control_tokens_are_the_ranges_decoding_skips():
    tokens, scores, types = vocabulary()
    assert sentencepiece_model(tokens, scores, types, unk_id=3)[1] == [(0, 6)]


@pytest.mark.parametrize("text", STRINGS)
def test_encodes_as_the_tokenizer_json_of_the_same_vocabulary(both, text):
    ours, theirs = both
    assert ours.encode(text, add_special_tokens=False).ids == theirs.encode(text, add_special_tokens=False).ids
    assert ours.encode(text).ids == [2] + theirs.encode(text, add_special_tokens=False).ids


def test_decodes_as_the_tokenizer_json_skipping_the_control_tokens(both):
    ours, theirs = both
    for text in STRINGS:
        ids = theirs.encode(text, add_special_tokens=False).ids + [1, 2]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.get_vocab_size() == theirs.get_vocab_size(with_added_tokens=True)
    assert [e.ids for e in ours.encode_batch(STRINGS[:2], add_special_tokens=False)] == \
           [theirs.encode(t, add_special_tokens=False).ids for t in STRINGS[:2]]


def test_a_space_run_longer_than_its_tokens_starts_with_the_longest(both):
    """The one known difference: sentencepiece (as Gemma's own tokenizer.model and llama.cpp) reads a run of spaces
    longer than every space token from its longest token on; tokenizers' added-token matcher splits it otherwise (4
    spaces as 2 + 2 here; Gemma 3's runs of 32 or more as runs of 16 first)."""
    ours, theirs = both
    three, two = (len(CONTROL_TOKENS) + USER_TOKENS.index(run) for run in ("   ", "  "))
    space = len(CONTROL_TOKENS) + len(USER_TOKENS) + 256 + PIECES.index(SPACE)
    assert ours.encode("    x", add_special_tokens=False).ids[:2] == [three, space]
    assert theirs.encode("    x", add_special_tokens=False).ids[:2] == [two, two]


def test_a_damaged_vocabulary_and_missing_files_are_refused_by_name(tmp_path, both):
    tokens, scores, types = vocabulary()
    with pytest.raises(InputError, match="damaged"):
        sentencepiece_model(tokens, scores[:-1], types, unk_id=3)
    with pytest.raises(InputError, match="spelled by two tokens"):
        sentencepiece_model(tokens + [SPACE * 2], scores + [0.0], types + [NORMAL], unk_id=3)
    with pytest.raises(InputError, match="convert the folder again"):
        SentencePieceVocab(tmp_path / "tokenizer.model", 2, [])
    with pytest.raises(InputError, match="tokenizer.json"):
        both[0].to_str()
