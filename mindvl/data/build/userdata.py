"""Your own data for `mindvl data build --from-folder DIR` (or `data.source: DIR` in a recipe).

Layout::

    DIR/
      train.jsonl        one JSON object per line (blank lines are skipped)
      test.jsonl         the same for the evaluation split
      images/...         any layout: paths in the JSONL are relative to DIR
      audio/...          optional recordings of the questions

    {"image": "images/cat.jpg", "question": "What animal is this?", "answer": "cat",
     "caption": "a cat on a sofa", "audio": "audio/q17.wav"}

`image`, `question` and `answer` are required strings; `caption` and `audio` are optional. Several
lines may share an image (one line per question). A line with `conversations` instead is a conversation
for the generative model (LLaVA's convention, mindvl/data/conversation_samples.py):

    {"id": "7", "image": "images/cat.jpg", "audio": "audio/q7.wav",
     "conversations": [{"from": "human", "value": "<image>\\n<audio>"}, {"from": "gpt", "value": "A cat."}]}

it goes, cleaned, into the split's conversation table (with the conversations derived from the question
lines); `limit` keeps a split's first `limit` conversation lines. Images are anything Pillow decodes (PNG, JPEG, ...);
they are stored as their original bytes. Audio is anything soundfile reads (WAV, FLAC, OGG), any rate
and channel count: it is mixed to mono and resampled to preprocess.sample_rate. A line's `audio` becomes
a clip of its question (voice "user") in speech.mindrecord; questions without a usable recording in a
split are spoken by the split's espeak-ng voices, as for easy-VQA.

Captions: a line's caption labels that line's row; lines of an image without one use the image's first
caption; an image with no caption at all gets one derived from easy-VQA-style questions ("what shape",
"what color") or is dropped as `no_caption`. The answer list, question list and captions in meta.json
come from the data (sorted). Image ids number each split's distinct images in order of first use.

Nothing here stops a build: a line that is not a JSON object, lacks a required key, or names a path
outside DIR is dropped as `bad_line` with its line number; missing and corrupt files are dropped later
by the build with the line number of their first use (see mindvl/data/build/cleaning.py for every reason).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from mindvl.data.build.cleaning import Drop, normalize_text
from mindvl.data.build.source import SPLITS, Source, SourceSplit
from mindvl.errors import ConfigError

REQUIRED = ("image", "question", "answer")
OPTIONAL = ("caption", "audio")
LICENCE = "user-provided"


def read_source(folder: Union[str, Path], limit: int = 0) -> Source:
    """Read DIR/train.jsonl and DIR/test.jsonl; `limit` > 0 keeps each split's first `limit` images."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"data.source: {folder} is not a folder; give \"easy-vqa\" or a folder holding "
                          f"train.jsonl and test.jsonl (see mindvl/data/build/userdata.py)")
    missing = [f"{split}.jsonl" for split in SPLITS if not (folder / f"{split}.jsonl").is_file()]
    if missing:
        raise ConfigError(f"data.source: {folder} has no {' and no '.join(missing)}; a data folder holds "
                          f"train.jsonl and test.jsonl with one {{\"image\", \"question\", \"answer\"}} object per line")
    drops: List[Drop] = []
    splits: Dict[str, SourceSplit] = {}
    questions, answers = set(), set()
    for split in SPLITS:
        lines, conversations = _read_lines(folder, split, drops)
        for line in lines:
            questions.add(line["question"])
            answers.add(normalize_text(line["answer"]))
        splits[split] = _to_split(folder, split, lines, limit)
        splits[split].conversations = conversations[:limit] if limit else conversations
        splits[split].folder = str(folder)
    return Source(name=str(folder), splits=splits, questions=sorted(questions), answers=sorted(answers),
                  licences=[{"name": "user data", "path": str(folder), "license": LICENCE}],
                  fingerprint=fingerprint(folder), drops=drops)


def _read_lines(folder: Path, split: str, drops: List[Drop]) -> Tuple[List[Dict], List[Tuple[str, Dict]]]:
    """The split's question lines, and its conversation lines as (ref, object) (checked by the build)."""
    name = f"{split}.jsonl"
    lines, conversations = [], []
    with open(folder / name, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            ref = f"{name}:{number}"
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
                if isinstance(record, dict) and "conversations" in record:
                    conversations.append((ref, record))
                    continue
                problem = _problem(folder, record)
            except (UnicodeDecodeError, ValueError) as exc:
                record, problem = None, f"not valid JSON ({exc})"
            if problem:
                drops.append(Drop(split, ref, "bad_line", problem))
                continue
            record["ref"] = ref
            lines.append(record)
    return lines, conversations


def _problem(folder: Path, record) -> Optional[str]:
    """Why a parsed line cannot be used, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for key in REQUIRED:
        if not isinstance(record.get(key), str) or not record[key].strip():
            return f"{key!r}: expected a non-empty string, got {record.get(key)!r}"
    for key in OPTIONAL:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key!r}: expected a string, got {record[key]!r}"
    unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        return f"unknown keys {unknown}; a line holds {list(REQUIRED + OPTIONAL)}"
    for key in ("image", "audio"):
        if record.get(key):
            path = Path(record[key])
            if path.is_absolute() or ".." in path.parts:
                return f"{key!r}: {record[key]!r} must be a path inside the data folder, relative to it"
    return None


def _to_split(folder: Path, split: str, lines: List[Dict], limit: int) -> SourceSplit:
    ids: Dict[str, int] = {}
    image_refs: Dict[int, str] = {}
    for line in lines:
        if line["image"] not in ids:
            ids[line["image"]] = len(ids)
            image_refs[ids[line["image"]]] = f"{line['ref']} {line['image']}"
    kept = {path: i for path, i in ids.items() if not limit or i < limit}
    rows = [line for line in lines if line["image"] in kept]
    return SourceSplit(
        name=split,
        questions=[line["question"] for line in rows],
        answers=[line["answer"] for line in rows],
        image_ids=[kept[line["image"]] for line in rows],
        image_paths={i: str(folder / path) for path, i in kept.items()},
        captions=[line.get("caption") or None for line in rows],
        audio=[str(folder / line["audio"]) if line.get("audio") else None for line in rows],
        refs=[line["ref"] for line in rows],
        image_refs={i: image_refs[i] for i in kept.values()})


def fingerprint(folder: Path) -> str:
    """sha256 over every file's relative path, size and modification time: changes when the data may have."""
    digest = hashlib.sha256()
    entries: List[Tuple[str, int, int]] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    for entry in entries:
        digest.update(repr(entry).encode())
    return digest.hexdigest()
