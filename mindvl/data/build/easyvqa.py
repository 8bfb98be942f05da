"""The easy-VQA source: questions, answers and image paths per split, and a caption per image.

easy-VQA ships 64x64 PNGs of one coloured shape each and ~10 questions per image. Its questions say
enough to name the shape and its colour, which gives every image a caption ("a blue circle") for
image<->text contrastive training without any extra labels.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import easy_vqa

from mindvl.data.build.source import SPLITS, Source, SourceSplit

LICENCE = {"name": "easy-VQA", "license": "MIT", "url": "https://pypi.org/project/easy-vqa/",
           "content": "64x64 PNG images of one coloured shape, questions and answers"}
SHAPES = ("circle", "rectangle", "triangle")
COLORS = ("black", "blue", "brown", "gray", "green", "red", "teal", "yellow")

_SHAPE_WORD = "|".join(SHAPES)
_COLOR_WORD = "|".join(COLORS)
# "what shape is in the image?" / "what is the blue shape?" -> the answer is the shape
_ASK_SHAPE = re.compile(rf"^what shape\b|^what is the (?P<color>{_COLOR_WORD}) shape\b")
# "what color is the circle?" / "what is the color of the shape?" -> the answer is the colour
_ASK_COLOR = re.compile(rf"^what (?:color is|is the color of) the (?P<shape>{_SHAPE_WORD}|shape)\b")
# yes/no questions name one shape ("a circle") or one colour ("a blue shape")
_MENTION = re.compile(rf"\b(?P<color>{_COLOR_WORD}) shape\b|\b(?P<shape>{_SHAPE_WORD})\b")
_NEGATED = re.compile(r"\bnot\b|^is no\b")


def answers() -> List[str]:
    """The 13 answer strings in easy-VQA's order (answer_id indexes this list)."""
    return list(easy_vqa.get_answers())


def load_split(split: str, limit: int = 0) -> SourceSplit:
    """Questions and image paths of `split`; `limit` > 0 keeps the `limit` lowest image ids (all questions
    of those images), 0 keeps everything."""
    if split == "train":
        questions, answers_, ids = easy_vqa.get_train_questions()
        paths = easy_vqa.get_train_image_paths()
    elif split == "test":
        questions, answers_, ids = easy_vqa.get_test_questions()
        paths = easy_vqa.get_test_image_paths()
    else:
        raise ValueError(f"split {split!r}: expected one of {list(SPLITS)}")
    kept = sorted(int(i) for i in paths)
    if limit:
        kept = kept[:limit]
    keep = set(kept)
    rows = [(q, a, int(i)) for q, a, i in zip(questions, answers_, ids) if int(i) in keep]
    return SourceSplit(split, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                       {i: str(paths[i]) for i in kept},
                       image_refs={i: f"easy-vqa {split} image {i}" for i in kept})


def read_source(limit: int = 0) -> Source:
    """Both splits (see `load_split`), the question and answer lists, and the licence for card.json."""
    splits = {split: load_split(split, limit) for split in SPLITS}
    for split in splits.values():
        counter = {}
        refs = []
        for i in split.image_ids:  # "easy-vqa train image 12 q3": the 4th question of image 12
            refs.append(f"easy-vqa {split.name} image {i} q{counter.get(i, 0)}")
            counter[i] = counter.get(i, 0) + 1
        split.refs = refs
    version = _version()
    return Source(name="easy-vqa", splits=splits, questions=all_questions(), answers=answers(),
                  licences=[{**LICENCE, "version": version}], fingerprint=f"easy-vqa {version}")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("easy-vqa")
    except metadata.PackageNotFoundError:  # pragma: no cover - imported above, so installed somehow
        return "unknown"


def all_questions() -> List[str]:
    """The distinct question strings of both splits, sorted (question_id indexes this list)."""
    return sorted({q for get in (easy_vqa.get_train_questions, easy_vqa.get_test_questions) for q in get()[0]})


def derive_caption(pairs: Sequence[Tuple[str, str]]) -> Tuple[Optional[str], str]:
    """Caption an image from its own (question, answer) pairs: ("a blue circle", "") or (None, reason).

    Direct questions ("what shape ...", "what color ...") give the shape and colour; yes/no questions
    fill a gap either by a positive answer ("is there a circle?" yes) or by ruling out all but one
    candidate. Reasons: "no_caption" (not enough evidence), "caption_conflict" (answers disagree).
    """
    shape_yes, color_yes, shape_no, color_no = set(), set(), set(), set()
    for question, answer in pairs:
        q, a = question.strip().lower(), answer.strip().lower()
        match = _ASK_SHAPE.search(q)
        if match:
            shape_yes.add(a)
            if match.group("color"):
                color_yes.add(match.group("color"))
            continue
        match = _ASK_COLOR.search(q)
        if match:
            color_yes.add(a)
            if match.group("shape") in SHAPES:
                shape_yes.add(match.group("shape"))
            continue
        if a not in ("yes", "no"):
            continue
        mention = _MENTION.search(q)
        if not mention:
            continue
        present = (a == "yes") != bool(_NEGATED.search(q))
        if mention.group("color"):
            (color_yes if present else color_no).add(mention.group("color"))
        else:
            (shape_yes if present else shape_no).add(mention.group("shape"))
    shape = _pick(shape_yes, shape_no, SHAPES)
    color = _pick(color_yes, color_no, COLORS)
    if "conflict" in (shape, color):
        return None, "caption_conflict"
    if shape is None or color is None:
        return None, "no_caption"
    return f"a {color} {shape}", ""


def _pick(yes: set, no: set, candidates: Sequence[str]) -> Optional[str]:
    if yes & no or len(yes) > 1 or (yes and not yes <= set(candidates)):
        return "conflict"
    if yes:
        return next(iter(yes))
    left = [c for c in candidates if c not in no]
    return left[0] if len(left) == 1 else None
