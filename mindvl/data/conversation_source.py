"""Conversation samples for the generative model: read from a user's JSONL, or derived from a built easy-VQA
root. Both give the same ConversationSample, which the chat template renders (mindvl.chat).

The JSONL is LLaVA's convention, one object per line:
  {"id": "42", "image": "images/42.png", "audio": "speech/42.wav",
   "conversations": [{"from": "human", "value": "<image>\\n<audio>"}, {"from": "gpt", "value": "a circle"}]}
"image" and "audio" (optional, paths relative to the file) are the sample's attachments; each needs its
placeholder in a user turn. A line that cannot be used is quarantined with its line number and the reason
(malformed JSON, an unknown key, a missing file, turns out of order, placeholders that do not match the
attachments, a repeated id), never a crash: the rest of the file is read.

From easy-VQA (question_kinds): "vqa" (<image> + typed question -> answer), "spoken" (<image> + the
question spoken in a training voice -> answer), "caption" ("Describe the image." -> the caption, once per
image) and "multi" (a question, then the description, in one conversation, for every `multi_every`-th
image), so the model learns to answer typed and spoken questions and to describe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from mindvl.chat import AUDIO, AUDIO_SLOT, IMAGE, IMAGE_SLOT, Turn, conversation_turns, placeholder_count
from mindvl.preprocess import InputError

from .records import SPEECH_TABLE, read_split, read_table
from .root import load_meta

SAMPLE_KEYS = ("id", "image", "audio", "conversations")
DESCRIBE = "Describe the image."
QUESTION_KINDS = ("vqa", "spoken", "caption", "multi")


@dataclass
class ConversationSample:
    """One conversation with its attachments' bytes (an encoded image; a WAV file or int16 PCM)."""

    id: str
    turns: List[Turn]
    image: Optional[bytes] = None
    audio: Optional[bytes] = None
    kind: str = "user"  # where it came from: "user", or one of QUESTION_KINDS

    @property
    def attachments(self) -> Tuple[int, int]:
        return int(self.image is not None), int(self.audio is not None)


@dataclass
class Quarantined:
    line: int
    id: str
    reason: str


@dataclass
class ConversationFile:
    samples: List[ConversationSample] = field(default_factory=list)
    quarantined: List[Quarantined] = field(default_factory=list)


def _sample(obj, base: Path, line: int) -> ConversationSample:
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object with {list(SAMPLE_KEYS)}, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(SAMPLE_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {unknown}; a sample has {list(SAMPLE_KEYS)}")
    sample_id = str(obj.get("id", line))
    turns = conversation_turns(obj.get("conversations"))
    files = {}
    for key, slot, placeholder in (("image", IMAGE_SLOT, IMAGE), ("audio", AUDIO_SLOT, AUDIO)):
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise InputError(f"{key}: expected a file path, got {value!r:.60}")
            path = (base / value).resolve()
            if not path.is_file():
                raise InputError(f"{key}: {value} does not exist (paths are relative to the JSONL's folder)")
            files[key] = path.read_bytes()
        placed = placeholder_count(turns, slot)
        if placed != (value is not None):
            raise InputError(f"{placed} {placeholder} placeholder(s) for {int(value is not None)} {key} "
                             f"attachment(s); put one {placeholder} in a user turn when the sample has "
                             f"{'an' if key == 'image' else 'a'} {key}, none otherwise")
    return ConversationSample(sample_id, turns, files.get("image"), files.get("audio"))


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
                sample = _sample(obj, path.parent, number)
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


def easyvqa_conversations(root: Union[str, Path], split: str, multi_every: int = 4) -> List[ConversationSample]:
    """The conversations of a built easy-VQA root's split (module docstring): per example a typed and a
    spoken question, per image its description, and a two-turn conversation for every multi_every-th image.
    Spoken questions take the clips of the split's own voices (training voices for train, unseen test
    voices for test), as int16 PCM."""
    meta = load_meta(root)
    voice_split = "test" if split == "test" else "train"
    clips: Dict[int, bytes] = {}
    for row in read_table(Path(root) / SPEECH_TABLE, ["question_id", "split", "pcm"]):
        if row["split"] == voice_split:
            clips.setdefault(int(row["question_id"]), bytes(row["pcm"]))
    samples: List[ConversationSample] = []
    described = set()
    for row in read_split(root, split, ["sample_id", "image", "image_id", "question_id", "caption_id", "answer_id"]):
        image, image_id = bytes(row["image"]), int(row["image_id"])
        question = meta["questions"][int(row["question_id"])]
        answer = meta["answers"][int(row["answer_id"])]
        caption = meta["captions"][int(row["caption_id"])]
        key = f"{split}-{int(row['sample_id'])}"
        samples.append(ConversationSample(f"{key}-vqa", _turns(f"{IMAGE}\n{question}", answer), image, kind="vqa"))
        clip = clips.get(int(row["question_id"]))
        if clip is not None:
            samples.append(ConversationSample(f"{key}-spoken", _turns(f"{IMAGE}\n{AUDIO}", answer), image, clip,
                                              kind="spoken"))
        if image_id not in described:
            described.add(image_id)
            samples.append(ConversationSample(f"{split}-image{image_id}-caption", _turns(f"{IMAGE}\n{DESCRIBE}", caption),
                                              image, kind="caption"))
            if multi_every and len(described) % multi_every == 0:
                samples.append(ConversationSample(f"{split}-image{image_id}-multi",
                                                  _turns(f"{IMAGE}\n{question}", answer, DESCRIBE, caption), image,
                                                  kind="multi"))
    return samples
