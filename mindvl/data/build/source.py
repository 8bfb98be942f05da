"""What a data source hands `mindvl data build`: per split, one row per (image, question) and the images.

Two sources exist: easy-VQA (`mindvl.data.build.easyvqa.read_source`) and a user folder
(`mindvl.data.build.userdata.read_source`). Texts arrive raw; the build normalises and checks them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mindvl.data.build.cleaning import Drop
from mindvl.data.records import SPLITS  # noqa: F401  (the splits a source hands over)


@dataclass
class SourceSplit:
    """One split of a source, restricted to the kept images (`limit`)."""

    name: str
    questions: List[str]  # parallel lists, one entry per (image, question) row
    answers: List[str]
    image_ids: List[int]
    image_paths: Dict[int, str]  # every kept image id -> file path (also images without questions)
    captions: List[Optional[str]] = field(default_factory=list)  # per row; empty list or None: derive it
    audio: List[Optional[str]] = field(default_factory=list)  # per row: a recording of the question, or None
    refs: List[str] = field(default_factory=list)  # per row: where it came from ("train.jsonl:12")
    image_refs: Dict[int, str] = field(default_factory=dict)  # per image: where it came from
    conversations: List[Tuple[str, Dict]] = field(default_factory=list)  # (ref, JSONL object): a user's own
    folder: str = ""  # what the conversations' paths are relative to

    def ref(self, row: int) -> str:
        return self.refs[row] if self.refs else f"{self.name} image {self.image_ids[row]} question {row}"

    def image_ref(self, image_id: int) -> str:
        return self.image_refs.get(image_id) or self.image_paths.get(image_id, f"{self.name} image {image_id}")

    def caption(self, row: int) -> Optional[str]:
        return self.captions[row] if self.captions else None

    def audio_path(self, row: int) -> Optional[str]:
        return self.audio[row] if self.audio else None


@dataclass
class Source:
    name: str  # "easy-vqa" or the folder path
    splits: Dict[str, SourceSplit]
    questions: List[str]  # every question of every split before `limit`: ids do not depend on the limit
    answers: List[str]  # answer candidates in id order (easy-VQA's 13; a folder's sorted); others are dropped
    licences: List[Dict]  # card.json "sources": name, licence, version or path
    fingerprint: str  # changes whenever the content may have changed (a complete root is reused only if equal)
    drops: List[Drop] = field(default_factory=list)  # lines the source could not read
