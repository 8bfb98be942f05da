"""The easy-VQA source: questions, answers and image paths per split, and a caption per image.

easy-VQA ships 64x64 PNGs of one coloured shape each and ~10 questions per image. Its questions say
enough to name the shape and its colour, which gives every image a caption ("a blue circle") for
image<->text contrastive training without any extra labels.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import easy_vqa

SPLITS = ("train", "test")
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


@dataclass
class SourceSplit:
    """One split of the source, restricted to the kept images."""

    name: str
    questions: List[str]  # parallel lists, one entry per (image, question)
    answers: List[str]
    image_ids: List[int]
    image_paths: Dict[int, str]  # every kept image id -> PNG path (also images without questions)


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
                       {i: str(paths[i]) for i in kept})


def all_questions() -> List[str]:
    """The distinct question strings of both splits, sorted (question_id indexes this list)."""
    return sorted({q for get in (easy_vqa.get_train_questions, easy_vqa.get_test_questions) for q in get()[0]})


def all_texts() -> List[str]:
    """Every question and answer in both splits: the fixed vocabulary the tokenizer is built from."""
    texts = []
    for get in (easy_vqa.get_train_questions, easy_vqa.get_test_questions):
        questions, answers_, _ = get()
        texts.extend(questions)
        texts.extend(answers_)
    return texts


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
