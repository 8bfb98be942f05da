"""A decoder's SentencePiece vocabulary as a small model file that the sentencepiece library reads.

Why: tokenizers' tokenizer.json of Gemma 3 (262,144 tokens, 514,906 merges) holds 290 MB once loaded and peaks
357 MB while it parses; the same vocabulary as a SentencePiece model is a 5 MB file holding 46 MB, a quarter of
`mindvl generate --weights int4`'s memory saved. The C++ runner reads the same file with libsentencepiece.

The file is built from a GGUF's token list, scores and token types with sentencepiece's own protobuf
(`sentencepiece_model`) and reads text as the folder's tokenizer.json does (transformers' GGUF builder): BPE by
score with byte fallback, spaces escaped as U+2581, no dummy prefix, whitespace kept. Every control and
user-defined token (GGUF types 3 and 4: <start_of_turn>, runs of spaces, HTML tags) becomes a user-defined piece,
so text spelling one is read as that one token, as tokenizers matches its added tokens; their spaces are escaped
like the text's, which sentencepiece matches after escaping. tokenizers calls the control tokens special and
decoding skips them: they are listed as ranges of ids (`SentencePieceVocab.special_ranges`, kept in the converted
folder's config), since a user-defined piece is always spelled out by sentencepiece.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

from mindvl.errors import InputError

SPACE = "\u2581"
UNKNOWN_PIECE = "<mindvl-unknown>"  # the UNKNOWN piece sentencepiece requires, after the vocabulary
# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _ranges(ids: Sequence[int]) -> List[Tuple[int, int]]:
    """Sorted ids as inclusive (first, last) runs: Gemma's 6,249 control tokens are 3 runs."""
    runs: List[List[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [(first, last) for first, last in runs]


def sentencepiece_model(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                        unk_id: int) -> Tuple[bytes, List[Tuple[int, int]]]:
    """(the serialized SentencePiece BPE model, the id ranges decoding skips) of a GGUF "llama" vocabulary.

    sentencepiece needs one piece of type UNKNOWN, which text cannot spell; with byte fallback it never produces
    it, so an UNKNOWN piece is appended after the vocabulary (id = its size) and the vocabulary's own unknown
    token stays a user-defined piece that text spells, as tokenizer.json reads it."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    if not len(tokens) == len(scores) == len(types):
        raise InputError(f"SentencePiece vocabulary: {len(tokens)} tokens, {len(scores)} scores and {len(types)} "
                         f"types differ; the GGUF's tokenizer metadata is damaged")
    kind = pb.ModelProto.SentencePiece
    model = pb.ModelProto()
    spelled = (CONTROL, USER_DEFINED, UNKNOWN)
    for index, (token, score, token_type) in enumerate(zip(tokens, scores, types)):
        piece = model.pieces.add()
        piece.score = float(score)
        if int(token_type) in spelled or index == unk_id:
            piece.piece, piece.type = token.replace(" ", SPACE), kind.USER_DEFINED
        else:
            piece.piece = token
            piece.type = {BYTE: kind.BYTE, UNUSED: kind.UNUSED}.get(int(token_type), kind.NORMAL)
    twice = sorted(spelling for spelling, n in Counter(piece.piece for piece in model.pieces).items() if n > 1)
    if twice:
        raise InputError(f"SentencePiece vocabulary: {twice[:3]} spelled by two tokens (a user-defined token and a piece "
                         f"once spaces are written as {SPACE}); sentencepiece cannot hold it, tokenizer.json can")
    unknown = model.pieces.add()
    unknown.piece, unknown.type, unknown.score = UNKNOWN_PIECE, kind.UNKNOWN, 0.0
    trainer = model.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(model.pieces)
    trainer.byte_fallback = True
    trainer.split_digits = True
    trainer.allow_whitespace_only_pieces = True
    trainer.split_by_whitespace = False
    # BOS is added by SentencePieceVocab (sentencepiece wants a control piece there, which text could not spell)
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = len(tokens), -1, -1, -1
    trainer.unk_piece = UNKNOWN_PIECE
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    special = _ranges([i for i, t in enumerate(types) if int(t) in (CONTROL, UNKNOWN) or i == unk_id])
    return model.SerializeToString(), special


@dataclass(frozen=True)
class Encoded:
    """What tokenizers' Encoding gives that generation reads."""
    ids: List[int]


class SentencePieceVocab:
    """A SentencePiece model file read like the `tokenizers.Tokenizer` of the same vocabulary, for what
    generation asks of it: `encode(...).ids`, `decode(ids, skip_special_tokens)`, the vocabulary size and (for
    grammars, which llguidance compiles from the tokenizer.json) `to_str`.

    bos_id: prepended when `add_special_tokens` (None: never); special_ranges: the ids decoding skips;
    tokenizer_json: the folder's tokenizer.json, read only when a grammar asks for it."""

    def __init__(self, path: Union[str, Path], bos_id: Optional[int], special_ranges: Sequence[Sequence[int]],
                 tokenizer_json: Optional[Union[str, Path]] = None) -> None:
        import sentencepiece

        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such SentencePiece model; convert the folder again with "
                             f"`mindvl convert llm`")
        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(self.path))
        self.bos_id = None if bos_id is None else int(bos_id)
        self.special_ranges = [(int(first), int(last)) for first, last in special_ranges]
        self.tokenizer_json = None if tokenizer_json is None else Path(tokenizer_json)

    def _special(self, token: int) -> bool:
        return any(first <= token <= last for first, last in self.special_ranges)

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoded:
        ids = self.processor.encode(text)
        return Encoded([self.bos_id, *ids] if add_special_tokens and self.bos_id is not None else ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> List[Encoded]:
        return [self.encode(text, add_special_tokens) for text in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        return self.processor.decode([i for i in ids if not self._special(i)] if skip_special_tokens else ids)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self.processor.get_piece_size() - 1  # the appended UNKNOWN piece is not the model's

    def to_str(self) -> str:
        if self.tokenizer_json is None or not self.tokenizer_json.is_file():
            raise InputError(f"{self.path}: grammars need the folder's tokenizer.json beside it; convert the folder "
                             f"again with `mindvl convert llm`")
        return self.tokenizer_json.read_text(encoding="utf-8")
