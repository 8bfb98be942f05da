"""The chat template of the generative model: a conversation -> decoder token ids, which positions hold
image, video and audio tokens, and which tokens the model learns to say.

One module for training data, generation and serving, so what the model is trained on is exactly what it
is prompted with (no train/serve skew). A conversation is the LLaVA convention: alternating user and
assistant turns; in a data set's text the placeholders IMAGE ("<image>") and AUDIO ("<audio>") mark
where a sample's image and spoken clip go. Each placeholder becomes a fixed number of *modality slots*
(the projector's token count: `image_tokens`, `audio_tokens`), whose embeddings the model replaces by
the projected encoder states (cells/multimodal_lm.py); the slot count always equals the token count the
encoder gives, and a conversation whose placeholders do not match its attachments is refused naming
both counts. A native-resolution model (Qwen2-VL, Qwen2.5-VL) gives each image or video as many tokens as its
patch grid makes: its prompts pass those counts (`sizes`), its slots hold the family's pad tokens
(<|image_pad|>, <|video_pad|>) and VIDEO ("<video>") marks a video's place.

Text is never parsed for control tokens: a user's text that spells a placeholder or a control token
("<start_of_turn>", "<image>") is encoded as the literal characters, so it can neither be bound to an
image nor open a turn. Length limits count modality slots; truncation drops whole exchanges from the end
and never cuts modality slots (a conversation whose attachments do not fit is refused).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.errors import InputError, shown

IMAGE = "<image>"
AUDIO = "<audio>"
VIDEO = "<video>"
ROLES = ("user", "assistant")
TEXT, IMAGE_SLOT, AUDIO_SLOT, VIDEO_SLOT = 0, 1, 2, 3  # Rendered.kinds values
PLACEHOLDERS = {IMAGE: IMAGE_SLOT, AUDIO: AUDIO_SLOT, VIDEO: VIDEO_SLOT}


@dataclass(frozen=True)
class ChatTemplate:
    """Control strings around turns (encoded with the tokenizer's special tokens recognised), the image's, the
    video's and the audio's delimiters, and the string generation stops at (the assistant turn's end).
    system: a system turn's opening ("" where the family has none); default_system: the text of the system turn
    put first when a conversation has none (None: no turn); image_pad / video_pad: the token each slot holds
    (""; the encoder's pad id). separator: the text a live user turn puts after its images before a clip or the
    question (a data set's LLaVA-style turns: "<image>\n<audio>", "<image>\nWhat color?"; "" where the family's
    processor puts nothing between a message's parts), so a prompt reads as the training conversations do."""

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
    video_open: str = ""
    video_close: str = ""
    system: str = ""
    default_system: Optional[str] = None
    image_pad: str = ""
    video_pad: str = ""
    separator: str = "\n"


TEMPLATES: Dict[str, ChatTemplate] = {
    # Gemma's turns; its vocabulary has image delimiters but no audio ones
    "gemma": ChatTemplate("gemma", "<bos>", "<start_of_turn>user\n", "<start_of_turn>model\n", "<end_of_turn>\n",
                          "<end_of_turn>", image_open="\n\n<start_of_image>", image_close="<end_of_image>\n\n"),
    # a tokenizer without chat tokens (a small BPE with <bos> and <eos>): plain-text roles, <eos> ends a turn
    "plain": ChatTemplate("plain", "<bos>", "User: ", "Assistant: ", "<eos>\n", "<eos>"),
    # a data set's word tokenizer (mindvl.preprocess.build_word_tokenizer, what a decoder trained from scratch
    # reads): its special tokens mark the roles, so no role word needs to be in its vocabulary
    "word": ChatTemplate("word", "[BOS]", "[CLS]", "[SEP]", "[EOS]", "[EOS]"),
    # Qwen2-VL / Qwen2.5-VL (ChatML): no BOS, every image or video between <|vision_start|> and <|vision_end|>;
    # the published checkpoints' templates add the system turn "You are a helpful assistant."
    # (mindvl.pretrained.qwen2_vl.checkpoint_template reads a checkpoint's own)
    "qwen": ChatTemplate("qwen", "", "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n", "<|im_end|>",
                         image_open="<|vision_start|>", image_close="<|vision_end|>", video_open="<|vision_start|>",
                         video_close="<|vision_end|>", system="<|im_start|>system\n", image_pad="<|image_pad|>",
                         video_pad="<|video_pad|>", separator=""),
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
    if model_cfg.is_native and not model_cfg.native.vit:  # Qwen2-VL, Qwen2.5-VL
        return "qwen"
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

    import dataclasses

    folder = cfg.model.pretrained.decoder or cfg.model.pretrained.vlm
    path = Path(folder) / "tokenizer.json" if folder else Path(cfg.data.root) / "tokenizer.json"
    if cfg.model.is_native and cfg.model.native.tokenizer:
        path = Path(cfg.model.native.tokenizer)
    if not path.is_file():
        raise InputError(f"tokenizer {path}: no such file; "
                         + ("convert the model again with `mindvl convert`" if folder
                            else "build the data set first with `mindvl data build --config <recipe>`"))
    template = chat_template(recipe_template(cfg.model))
    if cfg.model.is_native:  # the checkpoint's default system turn (mindvl.pretrained.qwen2_vl.checkpoint_template)
        template = dataclasses.replace(template, default_system=cfg.model.native.default_system)
    return ChatEncoder(Tokenizer.from_file(str(path)), template, image_tokens, audio_tokens)


Part = Union[str, int]  # text, or IMAGE_SLOT / AUDIO_SLOT / VIDEO_SLOT


@dataclass(frozen=True)
class Turn:
    role: str
    parts: Tuple[Part, ...]  # the content: text pieces and modality markers in order


def parse_content(text: str) -> Tuple[Part, ...]:
    """A data set's turn text -> parts, IMAGE, AUDIO and VIDEO placeholders turned into markers ("<image>\\nWhat
    color?" -> (IMAGE_SLOT, "\\nWhat color?")). Only data goes through this; a live user's text is one
    literal part."""
    parts: List[Part] = []
    rest = text
    while rest:
        found = [(rest.find(p), p) for p in PLACEHOLDERS if p in rest]
        if not found:
            parts.append(rest)
            break
        at, placeholder = min(found)
        if at:
            parts.append(rest[:at])
        parts.append(PLACEHOLDERS[placeholder])
        rest = rest[at + len(placeholder):]
    return tuple(parts)


def conversation_turns(conversations: Sequence[dict], name: str = "conversations") -> List[Turn]:
    """LLaVA-style [{"from"|"role": "human"|"user"|"gpt"|"assistant", "value"|"content": text}, ...] ->
    turns, checked: alternating, starting with the user, ending with the assistant; a "system" turn may come
    first (for a template that has system turns)."""
    aliases = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    if not isinstance(conversations, (list, tuple)) or not conversations:
        raise InputError(f"{name}: expected a non-empty list of turns, got {conversations!r:.80}")
    turns = []
    first = 1 if isinstance(conversations[0], dict) and conversations[0].get("from", conversations[0].get("role")) \
        == "system" else 0
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
        expected = "system" if index < first else ROLES[(index - first) % 2]
        if role != expected:
            raise InputError(f"{where}: expected the {expected}'s turn (turns alternate, the user first, a system "
                             f"turn only before them), got {role}")
        turns.append(Turn(role, parse_content(text) if role == "user" else (text,)))
    if turns[-1].role != "assistant":
        raise InputError(f"{name}: the last turn must be the assistant's (its answer is what the model learns)")
    return turns


def conversations_of(turns: Sequence[Turn]) -> List[dict]:
    """Turns back in the LLaVA convention, markers as their placeholders: conversation_turns of the result
    gives the same turns (a data set's text holds no literal placeholder: parse_content reads them all)."""
    spelled = {slot: placeholder for placeholder, slot in PLACEHOLDERS.items()}
    return [{"from": turn.role, "value": "".join(part if isinstance(part, str) else spelled[part] for part in turn.parts)}
            for turn in turns]


MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MARKERS = {"image": IMAGE_SLOT, "audio": AUDIO_SLOT, "video": VIDEO_SLOT}  # a history part's attachment types
MAX_MESSAGES = 1024  # messages one conversation may send (a longer chat keeps its newest within the prompt anyway)


def history_turns(messages: Any, name: str = "history") -> List[Turn]:
    """A live conversation's earlier messages -> turns: a list of {"role": "system" | "developer" | "user" |
    "assistant", "content": text, or a list of parts}, a part {"type": "text", "text": ...} (taken literally, never
    parsed for placeholders) or, in a user message, {"type": "image" | "audio" | "video"}: where one of the
    request's attachments goes (they bind in order, the history's first, the question's after). A system message
    comes first or not at all; consecutive messages of one role make one turn (conversation())."""
    if not isinstance(messages, (list, tuple)):
        raise InputError(f"{name}: expected a list of messages ({{\"role\": ..., \"content\": ...}}), got "
                         f"{shown(messages)}")
    if len(messages) > MAX_MESSAGES:
        raise InputError(f"{name}: {len(messages)} messages, more than the {MAX_MESSAGES} read; send the newest")
    turns = []
    for index, message in enumerate(messages):
        where = f"{name}[{index}]"
        role = MESSAGE_ROLES.get(message.get("role")) if isinstance(message, dict) else None
        if role is None:
            raise InputError(f"{where}: expected an object with role system, user or assistant and its content")
        if role == "system" and turns:
            raise InputError(f"{where}: a system message after the conversation started; put the instructions "
                             f"first")
        turns.append(Turn(role, _message_parts(message.get("content"), role, where)))
    return conversation(turns)


def _message_parts(content: Any, role: str, where: str) -> Tuple[Part, ...]:
    if isinstance(content, str):
        return (content,)
    if not isinstance(content, (list, tuple)):
        raise InputError(f"{where}.content: expected text or a list of parts, got {shown(content)}")
    parts: List[Part] = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in MARKERS and role == "user":
            parts.append(MARKERS[kind])
        else:
            allowed = "text, image, audio or video" if role == "user" else "text"
            raise InputError(f"{where}.content[{number}]: expected a part of type {allowed} ({role} message), got "
                             f"{shown(part)}")
    return tuple(parts)


def conversation(turns: Sequence[Turn]) -> List[Turn]:
    """Turns with consecutive turns of one role joined into one, a blank line between their texts (OpenAI's API
    allows two user messages in a row; a chat template alternates)."""
    joined: List[Turn] = []
    for turn in turns:
        if joined and joined[-1].role == turn.role:
            joined[-1] = Turn(turn.role, joined[-1].parts + ("\n\n",) + turn.parts)
        else:
            joined.append(turn)
    return joined


def placeholder_count(turns: Sequence[Turn], slot: int) -> int:
    """How many IMAGE_SLOT or AUDIO_SLOT markers the turns hold."""
    return sum(part == slot for turn in turns for part in turn.parts if not isinstance(part, str))


def question_turn(question: str, image: bool = False, audio: bool = False) -> Turn:
    """A live user turn of the fixed-resolution model: the image first, then the spoken question, then the typed
    text taken literally (user_turn with the LLaVA separator)."""
    return user_turn(question, [IMAGE_SLOT] * image, audio)


def user_turn(question: str, visuals: Sequence[int] = (), audio: bool = False, separator: str = "\n") -> Turn:
    """A live user turn: the images and videos (IMAGE_SLOT / VIDEO_SLOT markers, in order) side by side, then the
    clip, then the typed text taken literally (separated())."""
    parts = list(visuals) + ([AUDIO_SLOT] if audio else []) + ([question] if question else [])
    if not parts:
        raise InputError("question: give a text, an image or an audio clip")
    return Turn("user", separated(parts, separator))


def separated(parts: Sequence[Part], separator: str = "\n") -> Tuple[Part, ...]:
    """Parts with `separator` after each attachment that something other than an image or video follows (the
    template's ChatTemplate.separator; images and videos sit side by side), so a live turn reads as a data set's
    LLaVA-style "<image>\n<audio>\nWhat color?"."""
    out: List[Part] = []
    for part in parts:
        previous = out[-1] if out else None
        if separator and isinstance(previous, int) and not (previous in (IMAGE_SLOT, VIDEO_SLOT)
                                                            and part in (IMAGE_SLOT, VIDEO_SLOT)):
            if isinstance(part, str):
                part = separator + part
            else:
                out.append(separator)
        out.append(part)
    return tuple(out)


@dataclass
class Rendered:
    """One conversation as decoder input: ids (n,) int32 (pad at modality slots), kinds (n,) int8 (TEXT,
    IMAGE_SLOT, AUDIO_SLOT, VIDEO_SLOT), learn (n,) bool (the token is one the assistant says: the label of the
    position before it)."""

    ids: np.ndarray
    kinds: np.ndarray
    learn: np.ndarray
    dropped: int = 0  # a prompt's earliest turns left out to fit (ChatEncoder.prompt's drop_oldest)
    dropped_attachments: int = 0  # the attachments those turns held (the first ones, in order)

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
    `audio_tokens`: the slots one image and one clip take (the model's projector counts; a native-resolution
    model's prompts give each attachment's count as `sizes` instead)."""

    def __init__(self, tokenizer, template: ChatTemplate, image_tokens: int, audio_tokens: int, pad_id: int = 0):
        self.tokenizer = tokenizer
        self.template = template
        self.slots = {IMAGE_SLOT: int(image_tokens), AUDIO_SLOT: int(audio_tokens), VIDEO_SLOT: 0}
        self.pad_id = int(pad_id)
        special = sorted((t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special),
                         key=len, reverse=True)
        self._special_pattern = re.compile("|".join(map(re.escape, special))) if special else None
        self._cache: Dict[str, List[int]] = {}
        self.stop_id = self._one_token(template.stop, "stop string")
        self.slot_ids = {IMAGE_SLOT: self.pad_id, AUDIO_SLOT: self.pad_id, VIDEO_SLOT: self.pad_id}
        for kind, spelling in ((IMAGE_SLOT, template.image_pad), (VIDEO_SLOT, template.video_pad)):
            if spelling:
                self.slot_ids[kind] = self._one_token(spelling, "slot token")

    def _one_token(self, text: str, what: str) -> int:
        ids = self._control(text)
        if len(ids) != 1:
            raise InputError(f"chat template {self.template.name!r}: its {what} {text!r} is {len(ids)} tokens in this "
                             f"tokenizer; pick the template of the tokenizer's family (one token each)")
        return ids[0]

    def _control(self, text: str) -> List[int]:
        if text not in self._cache:
            self._cache[text] = self.tokenizer.encode(text, add_special_tokens=False).ids if text else []
        return self._cache[text]

    def literal_pieces(self, text: str) -> List[str]:
        """Text cut so that no piece spells a special token: every special token's spelling in it split after
        its first character. One scan of the text (a pattern of every spelling, longest first): linear in the
        text (a rescan per spelling found made 16,000 "[EOS]" in a question take seconds). The C++ runner cuts
        a SentencePiece package's text the same way (lite/runner/tokenizer.cc)."""
        pieces, start = [], 0
        for match in (self._special_pattern.finditer(text) if self._special_pattern else ()):
            pieces += [text[start:match.start()], match.group()[:1], match.group()[1:]]
            start = match.end()
        return [piece for piece in pieces + [text[start:]] if piece]

    def _literal(self, text: str) -> List[int]:
        """Text as characters, so the tokenizer reads a special token's spelling as text, never as the control
        token: its literal pieces in one batch to the tokenizer."""
        pieces = self.literal_pieces(text)
        encoded = self.tokenizer.encode_batch(pieces, add_special_tokens=False) if pieces else []
        return [token for encoding in encoded for token in encoding.ids]

    def _slots(self, kind: int, count: int) -> Tuple[List[int], List[int]]:
        t = self.template
        open_, close = {IMAGE_SLOT: (t.image_open, t.image_close), AUDIO_SLOT: (t.audio_open, t.audio_close),
                        VIDEO_SLOT: (t.video_open, t.video_close)}[kind]
        head, tail = self._control(open_), self._control(close)
        ids = head + [self.slot_ids[kind]] * count + tail
        kinds = [TEXT] * len(head) + [kind] * count + [TEXT] * len(tail)
        return ids, kinds

    def _turn(self, turn: Turn, sizes, answer_open: bool = False) -> Tuple[List[int], List[int], List[bool]]:
        t = self.template
        ids = list(self._control({"user": t.user, "assistant": t.assistant, "system": t.system}[turn.role]))
        kinds = [TEXT] * len(ids)
        learn = [False] * len(ids)
        for part in turn.parts:
            if isinstance(part, str):
                piece, piece_kinds = self._literal(part), None
            else:
                piece, piece_kinds = self._slots(part, next(sizes) if sizes is not None else self.slots[part])
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
               name: str = "conversation", videos: int = 0, sizes: Optional[Sequence[int]] = None) -> Rendered:
        """Training input: whole exchanges (a user turn and its answer) in order, after `bos` and the system
        turn. With max_length > 0 the exchanges past the limit are dropped, never the ones holding the
        attachments (if those do not fit the conversation is refused). `images`/`audios`/`videos`: how many the
        sample has, which must equal its placeholders; `sizes`: each attachment's token count, in order (a
        native-resolution model's)."""
        slots = self._check_attachments(turns, images, audios, videos, sizes, name)
        system, turns = self._split(turns)
        pieces, first = self._opening(system, turns[0] if turns else None)
        turns = [first] + turns[1:] if turns else turns
        last_attached = max([i for i, turn in enumerate(turns) if any(not isinstance(p, str) for p in turn.parts)],
                            default=-1)
        length = sum(len(piece[0]) for piece in pieces)
        for index in range(0, len(turns), 2):
            exchange = [self._turn(turn, slots) for turn in turns[index:index + 2]]
            size = sum(len(piece[0]) for piece in exchange)
            if max_length and length + size > max_length:
                if index <= last_attached or index == 0:
                    what = "attachments" if index <= last_attached else "first answer"
                    raise InputError(f"{name}: {length + size} tokens up to its {what} (with "
                                     f"{self._slot_count(images, audios, sizes)}), more than the {max_length} "
                                     f"allowed; shorten it or raise the length")
                break
            pieces += exchange
            length += size
        return self._join(pieces)

    def prompt(self, turns: Sequence[Turn], images: int = 0, audios: int = 0, max_length: int = 0,
               videos: int = 0, sizes: Optional[Sequence[int]] = None, drop_oldest: bool = False) -> Rendered:
        """Generation input: the turns so far (the system turn first, if any; the last one the user's) and the
        opened assistant turn the model continues. Past max_length it is refused, or with `drop_oldest` the
        oldest turns are left out, whole exchanges (a user turn and what follows it up to the next user turn),
        until it fits: never the system turn or the last user turn (Rendered.dropped counts the turns left out,
        dropped_attachments the attachments they held: the first ones, in order). Turns are tokenised newest
        first and no further back than can fit, so a long history costs what the prompt holds."""
        if not turns or turns[-1].role != "user":
            raise InputError("prompt: the last turn must be the user's")
        slots = self._check_attachments(turns, images, audios, videos, sizes, "prompt")
        system, rest = self._split(turns)
        counts = self._turn_sizes(rest, slots)
        answer = self._turn(Turn("assistant", ()), None, answer_open=True)
        rendered: Dict[int, tuple] = {}

        def piece(index: int, turn: Optional[Turn] = None) -> tuple:
            sizes_of = None if counts[index] is None else iter(counts[index])
            if turn is not None:
                return self._turn(turn, sizes_of)
            if index not in rendered:
                rendered[index] = self._turn(rest[index], sizes_of)
            return rendered[index]

        start, limited = 0, drop_oldest and max_length > 0
        if limited:  # the oldest turn that could fit on its own count
            length = len(answer[0])
            for index in range(len(rest) - 1, -1, -1):
                length += len(piece(index)[0])
                if length > max_length and index < len(rest) - 1:
                    start = index + 1
                    break
        while True:
            start = self._first_user(rest, start) if start else 0
            head, first = self._opening(system, rest[start])
            pieces = head + [piece(start, first)] + [piece(i) for i in range(start + 1, len(rest))] + [answer]
            length = sum(len(p[0]) for p in pieces)
            if not limited or length <= max_length or start == len(rest) - 1:
                break
            start += 1
        whole = self._join(pieces)
        if max_length and len(whole) > max_length:
            raise InputError(f"prompt: {len(whole)} tokens (with {self._slot_count(images, audios, sizes)}), "
                             f"more than the {max_length} allowed; shorten the question" +
                             (" (the earlier turns are already left out)" if start else " or the conversation"))
        whole.dropped = start
        whole.dropped_attachments = sum(not isinstance(p, str) for turn in rest[:start] for p in turn.parts)
        return whole

    @staticmethod
    def _first_user(turns: Sequence[Turn], start: int) -> int:
        """The first user turn at or after `start` (an exchange starts with the user's turn)."""
        while turns[start].role != "user":
            start += 1
        return start

    def _slot_count(self, images: int, audios: int, sizes: Optional[Sequence[int]]) -> str:
        if sizes is not None:
            return f"{sum(sizes)} vision tokens"
        return f"{self.slots[IMAGE_SLOT] * images} image and {self.slots[AUDIO_SLOT] * audios} audio tokens"

    def _opening(self, system: Optional[Turn], first: Optional[Turn]) -> Tuple[list, Optional[Turn]]:
        """The pieces before the exchanges (BOS, the system turn: the conversation's own or the template's
        default) and the first turn: a template without system turns (Gemma's) folds the system text into the
        first user turn, before it and a blank line, as the family's own template does."""
        ids = list(self._control(self.template.bos))
        pieces = [(ids, [TEXT] * len(ids), [False] * len(ids))]
        if system is None and self.template.default_system is not None:
            system = Turn("system", (self.template.default_system,))
        if system is None:
            return pieces, first
        if self.template.system:
            return pieces + [self._turn(system, None)], first
        if first is None or first.role != "user":
            raise InputError(f"chat template {self.template.name!r} has no system turn and folds the system text "
                             f"into the first user turn; the conversation must start with the user after it")
        text = "".join(part for part in system.parts if isinstance(part, str)) + "\n\n"
        lead = first.parts[0] if first.parts else None
        parts = (text + lead,) + first.parts[1:] if isinstance(lead, str) else (text,) + first.parts
        return pieces, Turn(first.role, parts)

    @staticmethod
    def _split(turns: Sequence[Turn]) -> Tuple[Optional[Turn], List[Turn]]:
        """(the system turn or None, the turns after it)."""
        if turns and turns[0].role == "system":
            return turns[0], list(turns[1:])
        return None, list(turns)

    @staticmethod
    def _turn_sizes(turns: Sequence[Turn], slots) -> List[Optional[List[int]]]:
        """Each turn's attachments' token counts, in order (None each without `slots`: the fixed counts)."""
        if slots is None:
            return [None] * len(turns)
        return [[next(slots) for part in turn.parts if not isinstance(part, str)] for turn in turns]

    @staticmethod
    def _join(pieces) -> Rendered:
        ids, kinds, learn = ([x for piece in pieces for x in piece[field]] for field in range(3))
        return Rendered(np.asarray(ids, np.int32), np.asarray(kinds, np.int8), np.asarray(learn, bool))

    def _check_attachments(self, turns: Sequence[Turn], images: int, audios: int, videos: int,
                           sizes: Optional[Sequence[int]], name: str):
        """Placeholders against attachments; the iterator over `sizes` the turns take their slot counts from
        (None: the encoder's fixed counts)."""
        for kind, given, what, placeholder in ((IMAGE_SLOT, images, "image", IMAGE), (AUDIO_SLOT, audios, "audio", AUDIO),
                                               (VIDEO_SLOT, videos, "video", VIDEO)):
            placed = placeholder_count(turns, kind)
            if placed != given:
                raise InputError(f"{name}: {placed} {what} placeholder(s) for {given} {what} attachment(s); put one "
                                 f"{placeholder!r} in a user turn per attachment")
        if sizes is None:
            if videos:
                raise InputError(f"{name}: a video's token count depends on its frames; this model takes no video")
            return None
        if len(sizes) != images + audios + videos:
            raise InputError(f"{name}: {len(sizes)} token counts for {images + audios + videos} attachments")
        return iter([int(size) for size in sizes])
