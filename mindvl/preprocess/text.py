"""Text: the word-level tokenizer mindvl builds over a data set, and the conventions of its ids.

Questions are [CLS] words [SEP], answers [BOS] words [EOS], both padded with [PAD] = 0; a published
tokenizer.json (MiniLM's WordPiece) is read with the same conventions (`TextTokenizer.pretrained`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple, Union

import numpy as np

from mindvl.errors import InputError

PAD, UNK, CLS, SEP, BOS, EOS = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, BOS, EOS)  # ids 0..5 in this order


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the conventions mindvl uses for questions, captions and answers."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
        missing = [tok for tok, i in ids.items() if i is None]
        if missing:
            raise InputError(f"tokenizer: missing special tokens {missing}; rebuild it with "
                             f"mindvl.preprocess.build_word_tokenizer or `mindvl data build`")
        self.pad_id, self.unk_id, self.cls_id = ids[PAD], ids[UNK], ids[CLS]
        self.sep_id, self.bos_id, self.eos_id = ids[SEP], ids[BOS], ids[EOS]
        self._special_ids = frozenset(ids.values())

    @classmethod
    def load(cls, path: Union[str, Path]) -> "TextTokenizer":
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise InputError(f"tokenizer {path}: no such file; run `mindvl data build --config ...` first")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
            raise InputError(f"tokenizer {path}: not a valid tokenizer.json ({exc}); rebuild the data set") from exc

    @classmethod
    def pretrained(cls, path: Union[str, Path]) -> "TextTokenizer":
        """A published tokenizer.json (e.g. MiniLM's WordPiece, or a converted text encoder's folder) with
        [BOS] and [EOS] added after its vocabulary when it lacks them (the answer LM needs them; a text
        encoder never sees them, so its embedding table keeps its size). Its own truncation and padding
        are switched off: mindvl pads and checks lengths itself."""
        from tokenizers import Tokenizer

        path = Path(path)
        path = path / "tokenizer.json" if path.is_dir() else path
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a missing or malformed file
            raise InputError(f"tokenizer {path}: not a readable tokenizer.json ({exc}); pass the tokenizer.json of "
                             f"a published model or a `mindvl convert` text folder") from exc
        tokenizer.no_truncation()
        tokenizer.no_padding()
        missing = [tok for tok in (BOS, EOS) if tokenizer.token_to_id(tok) is None]
        if missing:
            tokenizer.add_special_tokens(missing)
        return cls(tokenizer)

    def count(self, text: str) -> int:
        """Tokens of `text` with the two special tokens around it ([CLS]/[SEP] or [BOS]/[EOS])."""
        return len(self._ids(text, "text")) + 2

    def save(self, path: Union[str, Path]) -> None:
        self.tokenizer.save(str(path), pretty=True)

    def to_str(self) -> str:
        return self.tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def tokens(self, text: str) -> List[str]:
        """The word tokens of `text` without special tokens ("What color?" -> ["what", "color", "?"])."""
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def _ids(self, text: str, name: str) -> List[int]:
        if not isinstance(text, str):
            raise InputError(f"{name}: expected a string, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, max_length: int, name: str = "text") -> Tuple[np.ndarray, np.ndarray]:
        """[CLS] words [SEP] padded with [PAD] -> (ids int32 (max_length,), mask float32 (max_length,))."""
        words = self._ids(text, name)
        ids = [self.cls_id, *words, self.sep_id]
        if len(ids) > max_length:
            raise InputError(f"{name}: {text!r} is {len(ids)} tokens with [CLS]/[SEP] but at most {max_length} fit "
                             f"(preprocess.max_text_length); shorten the text or raise the limit")
        out = np.full((max_length,), self.pad_id, np.int32)
        out[:len(ids)] = ids
        mask = np.zeros((max_length,), np.float32)
        mask[:len(ids)] = 1.0
        return out, mask

    def encode_answer(self, text: str, max_length: int, name: str = "answer") -> np.ndarray:
        """[BOS] words [EOS] padded with [PAD] -> int32 (max_length,): the causal LM target."""
        ids = [self.bos_id, *self._ids(text, name), self.eos_id]
        if len(ids) > max_length:
            raise InputError(f"{name}: {text!r} is {len(ids)} tokens with [BOS]/[EOS] but at most {max_length} fit "
                             f"(preprocess.max_answer_length); shorten the answer or raise the limit")
        out = np.full((max_length,), self.pad_id, np.int32)
        out[:len(ids)] = ids
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text, stopping at [EOS] or [PAD] and skipping other special tokens."""
        words = []
        for i in ids:
            i = int(i)
            if i in (self.eos_id, self.pad_id):
                break
            if i in self._special_ids:
                continue
            token = self.tokenizer.id_to_token(i)
            words.append(token if token is not None else UNK)
        return re.sub(r" ([?.,!;:'])", r"\1", " ".join(words))


def build_word_tokenizer(texts: Sequence[str]) -> TextTokenizer:
    """A word-level tokenizer over `texts`: lowercase, split on whitespace and punctuation.

    Trained with `WordLevelTrainer` (every word seen at least once); ids are then fixed in a
    deterministic order: the special tokens 0..5, then the words sorted, so the same texts always give
    the same ids whatever order the trainer's counts come out in.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    def blank() -> Tokenizer:
        return Tokenizer(models.WordLevel({PAD: 0, UNK: 1}, unk_token=UNK))

    trainer_tok = blank()
    _configure(trainer_tok, normalizers, pre_tokenizers)
    trainer = trainers.WordLevelTrainer(vocab_size=1 << 20, min_frequency=1, show_progress=False,
                                        special_tokens=list(SPECIAL_TOKENS))
    trainer_tok.train_from_iterator(list(texts), trainer=trainer)
    words = sorted(set(trainer_tok.get_vocab(with_added_tokens=True)) - set(SPECIAL_TOKENS))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *words])}

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    _configure(tokenizer, normalizers, pre_tokenizers)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    # so that tokenizer.json alone reproduces questions' ids (the serving side may use it directly)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])])
    return TextTokenizer(tokenizer)


def _configure(tokenizer, normalizers, pre_tokenizers) -> None:
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Punctuation()])


def tokenizer_from_json(text: str) -> TextTokenizer:
    """Rebuild a `TextTokenizer` from the JSON string `TextTokenizer.to_str()` wrote."""
    from tokenizers import Tokenizer

    try:
        return TextTokenizer(Tokenizer.from_str(text))
    except Exception as exc:
        raise InputError(f"tokenizer: not a valid tokenizer.json ({exc})") from exc
