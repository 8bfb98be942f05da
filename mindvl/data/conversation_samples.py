"""Conversation samples for the generative model: read from a user's JSONL, or derived from a built easy-VQA
root. Both give the same ConversationSample, which the chat template renders (mindvl.chat).

The JSONL is LLaVA's convention, one object per line:
  {"id": "42", "image": "images/42.png", "audio": "speech/42.wav",
   "conversations": [{"from": "human", "value": "<image>\\n<audio>"}, {"from": "gpt", "value": "a circle"}]}
"image" and "audio" (optional, paths relative to the file) are the sample's attachments; each needs its
placeholder in a user turn. "image" may list several files ("image": ["a.png", "b.png"], LLaVA-OneVision's way),
one <image> each, in order: a native-resolution VLM reads them all (the fixed-resolution model takes one). A line that cannot be used is quarantined with its line number and the reason
(malformed JSON, an unknown key, a missing file, turns out of order, placeholders that do not match the
attachments, a repeated id), never a crash: the rest of the file is read.

From easy-VQA (question_kinds): "vqa" (<image> + typed question -> answer), "spoken" (<image> + the
question spoken in a training voice -> answer), "caption" ("Describe the image." -> the caption, once per
image), "multi" (a question, then the description, in one conversation, for every `multi_every`-th
image) and "pair" (two images described in one answer, for every `multi_every`-th image with the one described
before it), so the model learns to answer typed and spoken questions and to describe, one image or several.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from mindvl.chat import (AUDIO, AUDIO_SLOT, IMAGE, IMAGE_SLOT, Turn, conversation_turns, conversations_of,
                         placeholder_count)
from mindvl.choices import CONVERSATION_KINDS
from mindvl.data.records import as_bytes, conversation_table, images_of, pack_images, read_split
from mindvl.errors import InputError

SAMPLE_KEYS = ("id", "image", "audio", "conversations")
DESCRIBE = "Describe the image."
DESCRIBE_BOTH = "Describe the two images, in order."
QUESTION_KINDS = tuple(kind for kind in CONVERSATION_KINDS if kind != "user")  # the kinds derived from a root


@dataclass
class ConversationSample:
    """One conversation with its attachments' bytes (an encoded image; a WAV file or int16 PCM)."""

    id: str
    turns: List[Turn]
    image: Optional[bytes] = None
    audio: Optional[bytes] = None  # a file's bytes (a JSONL's sample) or int16 PCM (a data root's)
    kind: str = "user"  # where it came from: "user", or one of QUESTION_KINDS
    image_id: int = -1  # the data root's image id (validation hold-out); -1: none or not from a root
    question_id: int = -1  # a spoken easy-VQA question: its clips in speech.mindrecord stand for `audio`
    extra_images: Tuple[bytes, ...] = ()  # the images after the first, in order (a multi-image sample)
    other_image_id: int = -1  # a derived "pair": its other image's id (validation holds both out or neither)

    @property
    def attachments(self) -> Tuple[int, int]:
        return len(self.images), int(self.audio is not None or self.question_id >= 0)

    @property
    def images(self) -> List[bytes]:
        return [] if self.image is None else [self.image, *self.extra_images]


@dataclass
class Quarantined:
    line: int
    id: str
    reason: str


@dataclass
class ConversationFile:
    samples: List[ConversationSample] = field(default_factory=list)
    quarantined: List[Quarantined] = field(default_factory=list)


def parse_sample(obj, base: Path, default_id: str) -> ConversationSample:
    """One JSONL object -> a sample (its id `default_id` when it gives none), its files read relative to
    `base`; InputError says what is wrong."""
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object with {list(SAMPLE_KEYS)}, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(SAMPLE_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {unknown}; a sample has {list(SAMPLE_KEYS)}")
    sample_id = str(obj.get("id", default_id))
    turns = conversation_turns(obj.get("conversations"))
    files: Dict[str, List[bytes]] = {}
    for key, slot, placeholder in (("image", IMAGE_SLOT, IMAGE), ("audio", AUDIO_SLOT, AUDIO)):
        value = obj.get(key)
        paths = value if key == "image" and isinstance(value, list) else [] if value is None else [value]
        if key == "image" and isinstance(value, list) and not value:
            raise InputError("image: an empty list; leave the key out for a sample without an image")
        files[key] = [_attachment(path, key, base) for path in paths]
        placed = placeholder_count(turns, slot)
        if placed != len(paths):
            raise InputError(f"{placed} {placeholder} placeholder(s) for {len(paths)} {key} attachment(s); put one "
                             f"{placeholder} in a user turn per {key} the sample has, in their order")
    images = files["image"]
    return ConversationSample(sample_id, turns, images[0] if images else None,
                              files["audio"][0] if files["audio"] else None, extra_images=tuple(images[1:]))


def _attachment(value, key: str, base: Path) -> bytes:
    """The bytes of an attachment's file, its path checked: inside the JSONL's folder, existing."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{key}: expected a file path{' or a list of them' if key == 'image' else ''}, got "
                         f"{value!r:.60}")
    if Path(value).is_absolute() or ".." in Path(value).parts:
        raise InputError(f"{key}: {value!r} must be a path inside the JSONL's folder, relative to it")
    path = base / value
    if not path.is_file():
        raise InputError(f"{key}: {value} does not exist (paths are relative to the JSONL's folder)")
    return path.read_bytes()


def read_conversations(path: Union[str, Path]) -> ConversationFile:
    """Every usable sample of a JSONL file, and the lines quarantined (with why)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"conversations {path}: no such file; give a JSONL with one conversation per line")
    result = ConversationFile()
    seen: Dict[str, int] = {}
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                result.quarantined.append(Quarantined(number, "", f"not JSON ({exc.msg} at column {exc.colno})"))
                continue
            sample_id = str(obj.get("id", number)) if isinstance(obj, dict) else str(number)
            try:
                sample = parse_sample(obj, path.parent, str(number))
            except InputError as exc:
                result.quarantined.append(Quarantined(number, sample_id, str(exc)))
                continue
            if sample.id in seen:
                result.quarantined.append(Quarantined(number, sample.id, f"id {sample.id!r} already used on line "
                                                                         f"{seen[sample.id]}"))
                continue
            seen[sample.id] = number
            result.samples.append(sample)
    return result


def _turns(*texts: str) -> List[Turn]:
    return conversation_turns([{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(texts)])


@dataclass
class VQARow:
    """One kept (image, question) example of a build, with its texts: what the conversations derive from."""

    sample_id: int
    image: bytes
    image_id: int
    question: str
    question_id: int
    answer: str
    caption: str


def derived_conversations(rows: Sequence[VQARow], split: str, multi_every: int = 4) -> List[ConversationSample]:
    """The conversations of a split's examples (module docstring), in row order: per example a typed and a
    spoken question (every kept example has clips in the split's voices), per image its description, and
    a two-turn conversation for every multi_every-th described image. The spoken ones name their question
    (`question_id`): the loader picks one of its clips per epoch, as the classifier's loader does."""
    samples: List[ConversationSample] = []
    described = set()
    before = None  # the image described last, its caption and its id
    for row in rows:
        key = f"{split}-{row.sample_id}"
        common = dict(image_id=row.image_id)
        samples.append(ConversationSample(f"{key}-vqa", _turns(f"{IMAGE}\n{row.question}", row.answer), row.image,
                                          kind="vqa", **common))
        samples.append(ConversationSample(f"{key}-spoken", _turns(f"{IMAGE}\n{AUDIO}", row.answer), row.image,
                                          kind="spoken", question_id=row.question_id, **common))
        if row.image_id not in described:
            described.add(row.image_id)
            samples.append(ConversationSample(f"{split}-image{row.image_id}-caption",
                                              _turns(f"{IMAGE}\n{DESCRIBE}", row.caption), row.image, kind="caption",
                                              **common))
            if multi_every and len(described) % multi_every == 0:
                samples.append(ConversationSample(f"{split}-image{row.image_id}-multi",
                                                  _turns(f"{IMAGE}\n{row.question}", row.answer, DESCRIBE, row.caption),
                                                  row.image, kind="multi", **common))
                if before is not None:
                    samples.append(ConversationSample(
                        f"{split}-image{row.image_id}-pair", _turns(f"{IMAGE}{IMAGE}\n{DESCRIBE_BOTH}",
                                                                    f"{before[1]}, then {row.caption}"),
                        before[0], kind="pair", extra_images=(row.image,), other_image_id=before[2], **common))
            before = (row.image, row.caption, row.image_id)
    return samples


def table_row(sample: ConversationSample, sample_id: int) -> Dict:
    """A sample as a row of records.CONVERSATION_SCHEMA (its audio already int16 PCM, or named by question)."""
    return {"sample_id": sample_id, "conversation": sample.id, "kind": sample.kind,
            "turns": json.dumps(conversations_of(sample.turns), ensure_ascii=False), "image": pack_images(sample.images),
            "image_id": sample.image_id, "other_image_id": sample.other_image_id, "question_id": sample.question_id,
            "pcm": sample.audio or b""}


def from_table_row(row: Dict) -> ConversationSample:
    """The sample a conversation table's row holds (table_row's inverse)."""
    images, pcm = images_of(row["image"]), as_bytes(row["pcm"])
    return ConversationSample(str(row["conversation"]), conversation_turns(json.loads(str(row["turns"]))),
                              images[0] if images else None, pcm or None, str(row["kind"]), int(row["image_id"]),
                              int(row["question_id"]), tuple(images[1:]), int(row["other_image_id"]))


def read_conversation_table(root: Union[str, Path], split: str) -> List[ConversationSample]:
    """Every conversation of a built root's split, in row order (evaluation, tests: small tables)."""
    return [from_table_row(row) for row in read_split(root, conversation_table(split))]
