"""The chat template of the generative model: a conversation -> decoder token ids, which positions hold
image and audio tokens, and which tokens the model learns to say.

One module for training data, generation and serving, so what the model is trained on is exactly what it
is prompted with (no train/serve skew). A conversation is the LLaVA convention: alternating user and
assistant turns; in a data set's text the placeholders IMAGE ("<image>") and AUDIO ("<audio>") mark
where a sample's image and spoken clip go. Each placeholder becomes a fixed number of *modality slots*
(the projector's token count: `image_tokens`, `audio_tokens`), whose embeddings the model replaces by
the projected encoder states (cells/multimodal_lm.py); the slot count always equals the token count the
encoder gives, and a conversation whose placeholders do not match its attachments is refused naming
both counts.

Text is never parsed for control tokens: a user's text that spells a placeholder or a control token
("<start_of_turn>", "<image>") is encoded as the literal characters, so it can neither be bound to an
image nor open a turn. Length limits count modality slots; truncation drops whole exchanges from the end
and never cuts modality slots (a conversation whose attachments do not fit is refused).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from mindvl.errors import InputError

IMAGE = "<image>"
AUDIO = "<audio>"
ROLES = ("user", "assistant")
TEXT, IMAGE_SLOT, AUDIO_SLOT = 0, 1, 2  # Rendered.kinds values


@dataclass(frozen=True)
class ChatTemplate:
    """Control strings around turns (encoded with the tokenizer's special tokens recognised), the image's
    and the audio's delimiters, and the string generation stops at (the assistant turn's end)."""

    name: str
    bos: str
    user: str
    assistant: str
    end: str
    stop: str
    image_open: str = ""
    image_close: str = ""
    audio_open: str = ""
    audio_close: str = ""


TEMPLATES: Dict[str, ChatTemplate] = {
    # Gemma's turns; its vocabulary has image delimiters but no audio ones
    "gemma": ChatTemplate("gemma", "<bos>", "<start_of_turn>user\n", "<start_of_turn>model\n", "<end_of_turn>\n",
                          "<end_of_turn>", image_open="\n\n<start_of_image>", image_close="<end_of_image>\n\n"),
    # a tokenizer without chat tokens (a small BPE with <bos> and <eos>): plain-text roles, <eos> ends a turn
    "plain": ChatTemplate("plain", "<bos>", "User: ", "Assistant: ", "<eos>\n", "<eos>"),
    # a data set's word tokenizer (mindvl.preprocess.build_word_tokenizer, what a decoder trained from scratch
    # reads): its special tokens mark the roles, so no role word needs to be in its vocabulary
    "word": ChatTemplate("word", "[BOS]", "[CLS]", "[SEP]", "[EOS]", "[EOS]"),
}
AUTO = "auto"  # model.chat_template: the template of the decoder's family (recipe_template)


def chat_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise InputError(f"chat template {name!r}: expected one of {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def recipe_template(model_cfg) -> str:
    """The template name a recipe's model.chat_template means: itself, or for "auto" the converted decoder's
    family's ("gemma" for Gemma 3) and "word" for a decoder trained from scratch on the data's tokenizer."""
    name = model_cfg.chat_template
    if name != AUTO:
        return chat_template(name).name
    folder = model_cfg.pretrained.decoder
    if not folder:
        return "word"
    import json
    from pathlib import Path

    architecture = json.loads((Path(folder) / "config.json").read_text()).get("architecture", "")
    if architecture != "gemma3":
        raise InputError(f"model.chat_template: no default template for a converted {architecture!r} decoder; "
                         f"set model.chat_template to one of {sorted(TEMPLATES)}")
    return "gemma"


def recipe_chat(cfg, image_tokens: int, audio_tokens: int) -> "ChatEncoder":
    """The chat encoder of a generative recipe (a Config): its decoder's tokenizer (the converted folder's
    tokenizer.json, else the data set's word tokenizer) and template (recipe_template)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    folder = cfg.model.pretrained.decoder
    path = Path(folder) / "tokenizer.json" if folder else Path(cfg.data.root) / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"tokenizer {path}: no such file; "
                         + ("convert the decoder again with `mindvl convert llm`" if folder
                            else "build the data set first with `mindvl data build --config <recipe>`"))
    return ChatEncoder(Tokenizer.from_file(str(path)), chat_template(recipe_template(cfg.model)), image_tokens,
                       audio_tokens)


Part = Union[str, int]  # text, or IMAGE_SLOT / AUDIO_SLOT


@dataclass(frozen=True)
class Turn:
    role: str
    parts: Tuple[Part, ...]  # the content: text pieces and modality markers in order


def parse_content(text: str) -> Tuple[Part, ...]:
    """A data set's turn text -> parts, IMAGE and AUDIO placeholders turned into markers ("<image>\\nWhat
    color?" -> (IMAGE_SLOT, "\\nWhat color?")). Only data goes through this; a live user's text is one
    literal part."""
    parts: List[Part] = []
    rest = text
    while rest:
        found = [(rest.find(p), p) for p in (IMAGE, AUDIO) if p in rest]
        if not found:
            parts.append(rest)
            break
        at, placeholder = min(found)
        if at:
            parts.append(rest[:at])
        parts.append(IMAGE_SLOT if placeholder == IMAGE else AUDIO_SLOT)
        rest = rest[at + len(placeholder):]
    return tuple(parts)


def conversation_turns(conversations: Sequence[dict], name: str = "conversations") -> List[Turn]:
    """LLaVA-style [{"from"|"role": "human"|"user"|"gpt"|"assistant", "value"|"content": text}, ...] ->
    turns, checked: alternating, starting with the user, ending with the assistant."""
    aliases = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
    if not isinstance(conversations, (list, tuple)) or not conversations:
        raise InputError(f"{name}: expected a non-empty list of turns, got {conversations!r:.80}")
    turns = []
    for index, turn in enumerate(conversations):
        where = f"{name}[{index}]"
        if not isinstance(turn, dict):
            raise InputError(f"{where}: expected an object with 'from' and 'value', got {turn!r:.80}")
        role = aliases.get(turn.get("from", turn.get("role")))
        text = turn.get("value", turn.get("content"))
        if role is None:
            raise InputError(f"{where}: 'from' must be one of {sorted(aliases)}, got {turn.get('from', turn.get('role'))!r}")
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: 'value' must be non-empty text, got {text!r:.80}")
        if role != ROLES[index % 2]:
            raise InputError(f"{where}: expected the {ROLES[index % 2]}'s turn (turns alternate, the user first), "
                             f"got {role}")
        turns.append(Turn(role, parse_content(text) if role == "user" else (text,)))
    if turns[-1].role != "assistant":
        raise InputError(f"{name}: the last turn must be the assistant's (its answer is what the model learns)")
    return turns


def conversations_of(turns: Sequence[Turn]) -> List[dict]:
    """Turns back in the LLaVA convention, markers as their placeholders: conversation_turns of the result
    gives the same turns (a data set's text holds no literal placeholder: parse_content reads them all)."""
    return [{"from": turn.role, "value": "".join(part if isinstance(part, str) else
                                                 IMAGE if part == IMAGE_SLOT else AUDIO for part in turn.parts)}
            for turn in turns]


def placeholder_count(turns: Sequence[Turn], slot: int) -> int:
    """How many IMAGE_SLOT or AUDIO_SLOT markers the turns hold."""
    return sum(part == slot for turn in turns for part in turn.parts if not isinstance(part, str))


def question_turn(question: str, image: bool = False, audio: bool = False) -> Turn:
    """A live user turn: the image first, then the spoken question, then the typed text taken literally."""
    parts: List[Part] = ([IMAGE_SLOT] if image else []) + ([AUDIO_SLOT] if audio else [])
    if question:
        parts.append(("\n" if parts else "") + question)
    if not parts:
        raise InputError("question: give a text, an image or an audio clip")
    return Turn("user", tuple(parts))


@dataclass
class Rendered:
    """One conversation as decoder input: ids (n,) int32 (pad at modality slots), kinds (n,) int8 (TEXT,
    IMAGE_SLOT, AUDIO_SLOT), learn (n,) bool (the token is one the assistant says: the label of the
    position before it)."""

    ids: np.ndarray
    kinds: np.ndarray
    learn: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def count(self, kind: int) -> int:
        return int((self.kinds == kind).sum())


def modality_slots(sample: Rendered, index: int, count: int, image_tokens: int, audio_tokens: int) -> np.ndarray:
    """Per position of sample `index` of `count`, its row in the batch's modality table [count images' tokens |
    count clips' tokens | the zero row]: its image's and its clip's tokens in order, the zero row for text."""
    rows = np.full(len(sample), count * (image_tokens + audio_tokens), np.int32)
    for kind, base in ((IMAGE_SLOT, index * image_tokens), (AUDIO_SLOT, count * image_tokens + index * audio_tokens)):
        where = np.flatnonzero(sample.kinds == kind)
        rows[where] = base + np.arange(len(where))
    return rows


class ChatEncoder:
    """Renders turns with a tokenizer (a `tokenizers.Tokenizer`) and a template; `image_tokens` and
    `audio_tokens`: the slots one image and one clip take (the model's projector counts)."""

    def __init__(self, tokenizer, template: ChatTemplate, image_tokens: int, audio_tokens: int, pad_id: int = 0):
        self.tokenizer = tokenizer
        self.template = template
        self.slots = {IMAGE_SLOT: int(image_tokens), AUDIO_SLOT: int(audio_tokens)}
        self.pad_id = int(pad_id)
        special = sorted((t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special),
                         key=len, reverse=True)
        self._special_pattern = re.compile("|".join(map(re.escape, special))) if special else None
        self._cache: Dict[str, List[int]] = {}
        stop = self._control(template.stop)
        if len(stop) != 1:
            raise InputError(f"chat template {template.name!r}: its stop string {template.stop!r} is {len(stop)} "
                             f"tokens in this tokenizer; pick a template whose turn end is one token")
        self.stop_id = stop[0]

    def _control(self, text: str) -> List[int]:
        if text not in self._cache:
            self._cache[text] = self.tokenizer.encode(text, add_special_tokens=False).ids if text else []
        return self._cache[text]

    def _literal(self, text: str) -> List[int]:
        """Text as characters: every special token's spelling in it split after its first character, so the
        tokenizer reads it as text, never as the control token. One scan of the text (a pattern of every
        spelling, longest first) and one batch of pieces to the tokenizer: linear in the text (a rescan per
        spelling found made 16,000 "[EOS]" in a question take seconds)."""
        pieces, start = [], 0
        for match in (self._special_pattern.finditer(text) if self._special_pattern else ()):
            pieces += [text[start:match.start()], match.group()[:1], match.group()[1:]]
            start = match.end()
        pieces = [piece for piece in pieces + [text[start:]] if piece]
        encoded = self.tokenizer.encode_batch(pieces, add_special_tokens=False) if pieces else []
        return [token for encoding in encoded for token in encoding.ids]

    def _slots(self, kind: int) -> Tuple[List[int], List[int]]:
        open_, close = ((self.template.image_open, self.template.image_close) if kind == IMAGE_SLOT
                        else (self.template.audio_open, self.template.audio_close))
        head, tail = self._control(open_), self._control(close)
        ids = head + [self.pad_id] * self.slots[kind] + tail
        kinds = [TEXT] * len(head) + [kind] * self.slots[kind] + [TEXT] * len(tail)
        return ids, kinds

    def _turn(self, turn: Turn, answer_open: bool = False) -> Tuple[List[int], List[int], List[bool]]:
        t = self.template
        ids = list(self._control(t.user if turn.role == "user" else t.assistant))
        kinds = [TEXT] * len(ids)
        learn = [False] * len(ids)
        for part in turn.parts:
            if isinstance(part, str):
                piece, piece_kinds = self._literal(part), None
            else:
                piece, piece_kinds = self._slots(part)
            ids += piece
            kinds += piece_kinds or [TEXT] * len(piece)
            learn += [turn.role == "assistant"] * len(piece)
        if not answer_open:
            end = self._control(t.end)
            ids += end
            kinds += [TEXT] * len(end)
            learn += [turn.role == "assistant"] * len(end)
        return ids, kinds, learn

    def render(self, turns: Sequence[Turn], images: int = 0, audios: int = 0, max_length: int = 0,
               name: str = "conversation") -> Rendered:
        """Training input: whole exchanges (a user turn and its answer) in order, after `bos`. With
        max_length > 0 the exchanges past the limit are dropped, never the ones holding the attachments
        (if those do not fit the conversation is refused). `images`/`audios`: how many the sample has,
        which must equal its placeholders."""
        self._check_attachments(turns, images, audios, name)
        last_attached = max([i for i, turn in enumerate(turns) if any(not isinstance(p, str) for p in turn.parts)],
                            default=-1)
        pieces = [self._start()]
        length = len(pieces[0][0])
        for index in range(0, len(turns), 2):
            exchange = [self._turn(turn) for turn in turns[index:index + 2]]
            size = sum(len(piece[0]) for piece in exchange)
            if max_length and length + size > max_length:
                if index <= last_attached or index == 0:
                    what = "attachments" if index <= last_attached else "first answer"
                    raise InputError(f"{name}: {length + size} tokens up to its {what} (with "
                                     f"{self.slots[IMAGE_SLOT] * images} image and {self.slots[AUDIO_SLOT] * audios} "
                                     f"audio tokens), more than the {max_length} allowed; shorten it or raise the "
                                     f"length")
                break
            pieces += exchange
            length += size
        return self._join(pieces)

    def prompt(self, turns: Sequence[Turn], images: int = 0, audios: int = 0, max_length: int = 0) -> Rendered:
        """Generation input: the turns so far, the last one the user's, and the opened assistant turn the
        model continues. Refused past max_length (a prompt is never cut)."""
        if not turns or turns[-1].role != "user":
            raise InputError("prompt: the last turn must be the user's")
        self._check_attachments(turns, images, audios, "prompt")
        pieces = [self._start()] + [self._turn(turn) for turn in turns]
        pieces.append(self._turn(Turn("assistant", ()), answer_open=True))
        rendered = self._join(pieces)
        if max_length and len(rendered) > max_length:
            raise InputError(f"prompt: {len(rendered)} tokens (with {self.slots[IMAGE_SLOT] * images} image and "
                             f"{self.slots[AUDIO_SLOT] * audios} audio tokens), more than the {max_length} allowed; "
                             f"shorten the question or the conversation")
        return rendered

    def _start(self):
        ids = list(self._control(self.template.bos))
        return ids, [TEXT] * len(ids), [False] * len(ids)

    @staticmethod
    def _join(pieces) -> Rendered:
        ids, kinds, learn = ([x for piece in pieces for x in piece[field]] for field in range(3))
        return Rendered(np.asarray(ids, np.int32), np.asarray(kinds, np.int8), np.asarray(learn, bool))

    @staticmethod
    def _check_attachments(turns: Sequence[Turn], images: int, audios: int, name: str) -> None:
        for kind, given, what, placeholder in ((IMAGE_SLOT, images, "image", IMAGE), (AUDIO_SLOT, audios, "audio", AUDIO)):
            placed = placeholder_count(turns, kind)
            if placed != given:
                raise InputError(f"{name}: {placed} {what} placeholder(s) for {given} {what} attachment(s); put one "
                                 f"{placeholder!r} in a user turn per attachment")
