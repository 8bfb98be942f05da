"""`mindvl data build`: a source + synthesised spoken questions -> a cleaned, sharded MindRecord data root.

Sources (data.source): "easy-vqa" (the PyPI package), or a folder of your own data in the layout of
mindvl/data/build/userdata.py (`mindvl data build --from-folder DIR`).

A root holds
  tokenizer.json            the word tokenizer over the kept questions, answers and captions, or the
                            published one named by data.tokenizer (+ [BOS]/[EOS]), lengths checked with it
  meta.json                 answers, questions, captions (ids index these), voices, preprocess, counts,
                            "tables": every split's MindRecord files in row order (records.table_files)
  train*.mindrecord(.db)    data.shards files per split, one row per (image, question): records.EXAMPLE_SCHEMA
  test*.mindrecord(.db)
  speech.mindrecord(.db)    one row per spoken question clip: records.SPEECH_SCHEMA
  conversations-train*.mindrecord(.db), conversations-test*...   one row per conversation:
                            records.CONVERSATION_SCHEMA
  quarantine.jsonl          one line per dropped item: split, unit, source, reason, value, threshold
  quarantine/               copies of corrupt source files
  card.json                 the dataset card: counts, sources and licences, sha256 of every file, cleaning
                            thresholds, mindvl version, build seconds
  report.json               the BuildReport (counts, drops by reason and split, timings, settings)

Stages: 1 texts are normalised and checked (cleaning.clean_text); 2 every image is decoded and measured,
captioned, deduplicated (a duplicate's questions move to the image it copies) and, with
data.cleaning.align_checkpoint, scored against its caption; 3 clips: user recordings are checked, every
question still without one is synthesised in the split's voices, and every clip is checked as the loader
will read it; 4 rows whose question has no clip are dropped and the rest are written in shards; 5 the
generative model's conversations (mindvl/data/conversation_samples.py) are derived from the kept rows and,
for a folder, joined by its own conversation lines (their images and clips checked as above), and written
in `conversations-<split>` shards. Nothing a source holds stops a build: each bad item is dropped with a
reason (cleaning.REASONS).

Resumable: the build works in `.<root>.partial` next to the root. The speech table and every example shard
is a unit with a done marker (its plan's digest and its files' sha256); a re-run with the same settings
after an interruption re-plans (cheap), skips every unit whose marker still matches, writes the rest,
and gives exactly the files an uninterrupted build gives. The finished folder is renamed into place, so a
root that looks complete is complete; a complete root built with the same settings is reused unless
`force=True` (which also discards a partial build).

Deterministic: the same source, settings and code give byte-identical MindRecord files (and tokenizer,
meta and quarantine). MindRecord stores no timestamps or absolute paths; its header and .db name the file's
base name only, so shards are written under their final names.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence, Set, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.config import CleaningConfig, Config, DataConfig
from mindvl.data import records
from mindvl.data.build import cleaning, easyvqa, speech, userdata
from mindvl.data.build.card import write_card
from mindvl.data.build.cleaning import Drop, Quarantine
from mindvl.data.build.report import SKIP_REASONS, BuildReport, read_report
from mindvl.data.build.source import SPLITS, Source, SourceSplit
from mindvl.data.build.units import ResumeUnit, plan_digest
from mindvl.data.conversation_samples import ConversationSample, VQARow, derived_conversations, parse_sample, table_row
from mindvl.data.root import FORMAT_VERSION, PARTIAL_STATE, check_replaceable, is_complete, open_partial, remove
from mindvl.errors import ConfigError
from mindvl.files import sha256_file, swap_folder
from mindvl.progress import progress_bar

USER_VOICE = "user"


class AlignmentScore(Protocol):
    """What the alignment filter needs of a model: cosine similarity of images[i] with captions[i]."""

    def score(self, images: Sequence[bytes], captions: Sequence[str]) -> np.ndarray: ...


# ----------------------------------------------------------------------------- entry point

def build_settings(cfg: Config, limit: int, source: Source) -> Dict:
    """Everything that determines a build's content; a root (or a partial build) is reused only if these match."""
    return {
        "format": FORMAT_VERSION,
        "source": source.name,
        "source_fingerprint": source.fingerprint,
        "limit": int(limit),
        "shards": int(cfg.data.shards),
        "train_voices": list(cfg.data.train_voices),
        "test_voices": list(cfg.data.test_voices),
        "speech_rates": [int(r) for r in cfg.data.speech_rates],
        "preprocess": P.preprocess_dict(cfg.preprocess),
        "cleaning": dataclasses.asdict(cfg.data.cleaning),
        "tokenizer": _file_digest(_tokenizer_file(cfg.data)) if cfg.data.tokenizer else "word",
    }


def _tokenizer_file(data: DataConfig) -> Path:
    """data.tokenizer as a tokenizer.json path (it may name a converted text encoder's folder)."""
    path = Path(data.tokenizer)
    return path / "tokenizer.json" if path.is_dir() else path


def rates_for_test_voices(rates: List[int]) -> List[int]:
    """Test voices speak at the middle rate only: new speakers are the point, not new speeds."""
    ordered = sorted(int(r) for r in rates)
    return [ordered[len(ordered) // 2]]


def read_source(data: DataConfig, limit: int) -> Source:
    """The source data.source names: "easy-vqa" or a user folder."""
    if data.source == "easy-vqa":
        return easyvqa.read_source(limit)
    return userdata.read_source(data.source, limit)


def build_dataset(cfg: Config, root: Union[str, Path, None] = None, limit: Optional[int] = None,
                  progress: bool = True, force: bool = False, scorer: Optional[AlignmentScore] = None) -> BuildReport:
    """Build the data root `root` (default cfg.data.root) from cfg.data.source; see the module docstring.

    `limit`: at most this many source images per split (default cfg.data.limit; 0: all), keeping every
    question of the kept images. Raises ConfigError for settings a user must fix (unknown voice, a root
    that is not a data set, a missing source folder, an unloadable alignment checkpoint), never for data.
    `scorer`: required when data.cleaning.align_checkpoint is set, the model that scores image-caption pairs
    (`mindvl.eval.alignment.AlignmentScorer(checkpoint)`, as `mindvl data build` passes): the data layer
    loads no model itself.
    """
    started = time.perf_counter()
    root = Path(root if root is not None else cfg.data.root)
    limit = cfg.data.limit if limit is None else int(limit)
    if limit < 0:
        raise ConfigError(f"data.limit: expected >= 0 (0 means all), got {limit}")
    if cfg.data.cleaning.align_checkpoint and scorer is None:
        raise ConfigError("data.cleaning.align_checkpoint: set, but build_dataset got no scorer; pass "
                          "scorer=mindvl.eval.alignment.AlignmentScorer(checkpoint) (mindvl data build does)")
    source = read_source(cfg.data, limit)
    source_seconds = round(time.perf_counter() - started, 2)
    settings = build_settings(cfg, limit, source)
    if not force and is_complete(root):
        previous = read_report(root)
        if previous is not None and previous.settings == settings:
            previous.already_built = True
            previous.root = str(root)
            return previous
    _check_voices(cfg.data)
    check_replaceable(root)

    root.parent.mkdir(parents=True, exist_ok=True)
    work = open_partial(root, settings, force)
    try:
        report = BuildReport(root=str(root), settings=settings)
        report.seconds["sources"] = source_seconds
        _build_into(work, cfg, source, report, progress, scorer)
        report.seconds["total"] = round(time.perf_counter() - started, 2)
        (work / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
        write_card(work, cfg, source, report)
        for name in PARTIAL_STATE:
            remove(work / name)
        swap_folder(work, root)
    finally:
        remove(work / ".lock")  # an interrupted build keeps its finished units for the next run
    return report


# ----------------------------------------------------------------------------- the build proper

@dataclass
class _Row:
    """One (image, question) example on its way to a table."""

    image_id: int
    question: str  # cleaned
    answer: str  # cleaned
    caption: Optional[str]  # cleaned, given by the source; None: the image's caption
    audio: Optional[str]  # a user recording of the question
    ref: str  # where it came from


@dataclass
class _Image:
    image_id: int
    ref: str
    data: bytes
    sha256: str  # of the encoded bytes (plan digests)
    facts: cleaning.ImageFacts
    rows: List[_Row]
    caption: Optional[str] = None  # the image's caption (given or derived)


def _build_into(work: Path, cfg: Config, source: Source, report: BuildReport, progress: bool,
                scorer: Optional[AlignmentScore]) -> None:
    pre, clean = cfg.preprocess, cfg.data.cleaning
    quarantine = Quarantine()
    quarantine.extend(source.drops)

    # 1. texts: every question, answer and caption is normalised and checked once
    with _stage(report.seconds, "text"):
        pretrained = P.TextTokenizer.pretrained(_tokenizer_file(cfg.data)) if cfg.data.tokenizer else None
        texts = _TextCleaner(pre, clean, pretrained.count if pretrained else None)
        answers = _answer_list(source, texts)
        questions = sorted({q for q in (texts.get(x, "question") for x in source.questions) if q})
        rows = {split: _rows(src, texts, set(answers), quarantine) for split, src in source.splits.items()}

    # 2. images: decode and measure, caption, deduplicate (test first: it is the reference), align
    with _stage(report.seconds, "images"):
        images: Dict[str, Dict[int, _Image]] = {}
        for split in ("test", "train"):
            src = source.splits[split]
            images[split] = _inspect_images(work, src, rows[split], pre, clean, quarantine, progress)
        _deduplicate(images, clean, quarantine, near=False)
        for split in ("test", "train"):
            _caption_images(split, images[split], texts, quarantine)
        _deduplicate(images, clean, quarantine, near=True)
    if clean.align_checkpoint:
        with _stage(report.seconds, "alignment"):
            _align(images, clean, report, quarantine, scorer)

    # 3. clips: user recordings, then espeak-ng for every used question still without a clip
    with _stage(report.seconds, "speech"):
        question_ids = {q: i for i, q in enumerate(questions)}
        final = {split: _final_rows(images[split], quarantine, split) for split in SPLITS}
        clips = _speech_unit(work, cfg, final, question_ids, quarantine, report, progress)

    # 4. examples: rows whose question has no clip are dropped, the rest go into shards
    kept: Dict[str, List[Tuple[_Image, _Row]]] = {}
    for split in SPLITS:
        spoken = {qid for qid, _, _, clip_split in clips if clip_split == split}
        kept[split] = []
        for image, row in final[split]:
            if question_ids[row.question] in spoken:
                kept[split].append((image, row))
            else:
                quarantine.add(split, row.ref, "no_audio", note=f"question {row.question!r}")
    captions = sorted({row.caption for split in SPLITS for _, row in kept[split]})
    caption_ids = {c: i for i, c in enumerate(captions)}
    answer_ids = {a: i for i, a in enumerate(answers)}
    tables: Dict[str, List[str]] = {}
    counts: Dict[str, Dict[str, int]] = {}
    for split in SPLITS:
        table = kept[split]
        with _stage(report.seconds, f"write_{split}"):
            tables[split] = _write_shards(work, split, table, cfg.data.shards, question_ids, caption_ids,
                                          answer_ids, report, progress)
        counts[split] = {
            "images": len(source.splits[split].image_paths),
            "source_examples": len(source.splits[split].questions),
            "images_used": len({image.image_id for image, _ in table}),
            "examples": len(table),
            "questions": len({row.question for _, row in table}),
            "captions": len({row.caption for _, row in table}),
            "clips": sum(clip_split == split for *_, clip_split in clips),
            "shards": len(tables[split]),
        }
    # 5. conversations for the generative model: derived from the kept examples, plus a folder's own
    for split in SPLITS:
        with _stage(report.seconds, f"conversations_{split}"):
            examples = [VQARow(i, image.data, image.image_id, row.question, question_ids[row.question], row.answer,
                               row.caption) for i, (image, row) in enumerate(kept[split])]
            samples = derived_conversations(examples, split) + _user_conversations(work, cfg, source.splits[split],
                                                                                 quarantine)
            name = records.conversation_table(split)
            tables[name] = _write_conversations(work, name, samples, cfg.data.shards, report, progress)
        counts[split]["conversations"] = len(samples)
        counts[split]["conversation_kinds"] = dict(sorted(Counter(sample.kind for sample in samples).items()))
    counts["speech"] = {"clips": len(clips), **{f"{split}_clips": counts[split]["clips"] for split in SPLITS},
                        "user_clips": sum(voice == USER_VOICE for _, voice, _, _ in clips)}

    by_split = quarantine.counts()
    report.counts = counts
    report.skips = {reason: sum(c[reason] for c in by_split.values()) for reason in SKIP_REASONS}
    report.skips_by_split = {split: {r: n for r, n in by_split.get(split, Counter()).items() if n} for split in SPLITS}
    report.voices = {"train": list(cfg.data.train_voices), "test": list(cfg.data.test_voices)}
    report.rates = {"train": sorted(int(r) for r in cfg.data.speech_rates),
                    "test": rates_for_test_voices(cfg.data.speech_rates)}
    report.quarantined = sorted({d.copy for d in quarantine.drops if d.copy})

    tokenizer = pretrained or P.build_word_tokenizer([cleaning.vocabulary_text(t)
                                                      for t in [*questions, *answers, *captions]])
    tokenizer.save(work / "tokenizer.json")
    quarantine.write(work / "quarantine.jsonl")
    meta = {
        "format": FORMAT_VERSION,
        "source": source.name,
        "answers": answers,
        "questions": questions,
        "captions": captions,
        "train_voices": report.voices["train"],
        "test_voices": report.voices["test"],
        "speech_rates": [int(r) for r in cfg.data.speech_rates],
        "test_speech_rates": report.rates["test"],
        "user_voice": USER_VOICE,
        "preprocess": P.preprocess_dict(pre),
        "counts": counts,
        "tables": tables,
    }
    (work / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False))


# ----------------------------------------------------------------------------- 1. texts

class _TextCleaner:
    """Cleans each distinct (text, field) once; remembers every kept text for the tokenizer."""

    def __init__(self, pre, clean: CleaningConfig, count_tokens=None) -> None:
        self.count_tokens = count_tokens  # a pretrained tokenizer's count (special tokens included), or None
        self.limits = {"question": (pre.max_text_length, clean.min_words),
                       "caption": (pre.max_text_length, 1),
                       "answer": (pre.max_answer_length, 1)}
        self.clean = clean
        self.cache: Dict[Tuple[str, str], cleaning.TextCheck] = {}  # (raw text, field) -> result

    def check(self, text: str, field_name: str) -> cleaning.TextCheck:
        key = (text, field_name)
        if key not in self.cache:
            max_tokens, min_words = self.limits[field_name]
            self.cache[key] = cleaning.clean_text(text, field_name, max_tokens, min_words, self.clean,
                                                  self.count_tokens)
        return self.cache[key]

    def get(self, text: str, field_name: str) -> Optional[str]:
        return self.check(text, field_name).text


def _answer_list(source: Source, texts: _TextCleaner) -> List[str]:
    """The answer list (answer_id indexes it): the source's answers that pass the checks, in its order."""
    return list(dict.fromkeys(a for a in (texts.get(x, "answer") for x in source.answers) if a))


def _rows(src: SourceSplit, texts: _TextCleaner, allowed: Set[str], quarantine: Quarantine) -> Dict[int, List[_Row]]:
    """image id -> its rows whose texts pass the checks, in source order; the others are dropped."""
    by_image: Dict[int, List[_Row]] = defaultdict(list)
    for i, (question, answer, image_id) in enumerate(zip(src.questions, src.answers, src.image_ids)):
        ref = src.ref(i)
        q, a = texts.check(question, "question"), texts.check(answer, "answer")
        failed = q if q.text is None else a if a.text is None else None
        if failed is not None:
            quarantine.add(src.name, ref, failed.reason, failed.value, failed.threshold,
                           note=f"{question!r}" if failed is q else f"answer {answer!r}")
            continue
        if a.text not in allowed:
            quarantine.add(src.name, ref, "unknown_answer", a.text, note=f"not one of {len(allowed)} answers")
            continue
        caption = None
        given = src.caption(i)
        if given:
            c = texts.check(given, "caption")
            if c.text is None:
                quarantine.add(src.name, ref, c.reason, c.value, c.threshold, note=f"caption {given!r}")
            caption = c.text
        by_image[image_id].append(_Row(image_id, q.text, a.text, caption, src.audio_path(i), ref))
    return by_image


# ----------------------------------------------------------------------------- 2. images

def _inspect_images(work: Path, src: SourceSplit, rows: Dict[int, List[_Row]], pre, clean: CleaningConfig,
                    quarantine: Quarantine, progress: bool) -> Dict[int, _Image]:
    """Decode and measure every image of the split; unusable ones are dropped (corrupt ones copied)."""
    kept: Dict[int, _Image] = {}
    for image_id in progress_bar(sorted(src.image_paths), desc=f"images {src.name}", unit="img", disable=not progress):
        path, ref = Path(src.image_paths[image_id]), src.image_ref(image_id)
        try:
            data = path.read_bytes()
        except OSError as exc:
            quarantine.add(src.name, ref, "image_missing", f"{type(exc).__name__}: {exc.strerror or exc}")
            continue
        facts = _checked_image(work, src.name, ref, data, f"{src.name}_{image_id}{path.suffix or '.bin'}", "image",
                               clean, pre, quarantine)
        if facts is None:
            continue
        kept[image_id] = _Image(image_id, ref, data, hashlib.sha256(data).hexdigest(), facts,
                                list(rows.get(image_id, [])))
    return kept


def _checked_image(work: Path, source: str, ref: str, data: bytes, copy_name: str, name: str, clean, pre,
                   quarantine: Quarantine):
    """An image's facts if the loader can decode it and it passes the quality checks; else None, the reason
    quarantined (an undecodable file copied aside as `copy_name`)."""
    try:
        facts = cleaning.inspect_image(data, clean.hash, name=name)
        P.decode_image(data, pre, name=name)  # exactly what the loader will do
    except P.InputError as exc:
        quarantine.add(source, ref, "bad_image", str(exc), copy=_quarantine_copy(work, copy_name, data))
        return None
    problem = cleaning.image_quality_problem(facts, clean)
    if problem is not None:
        quarantine.add(source, ref, *problem)
        return None
    return facts


def _caption_images(split: str, images: Dict[int, _Image], texts: _TextCleaner, quarantine: Quarantine) -> None:
    """Give every image a caption (its first given one, else derived from its questions); drop the rest."""
    for image_id in sorted(images):
        image = images[image_id]
        given = [row.caption for row in image.rows if row.caption]
        if given:
            image.caption = given[0]
        else:
            caption, reason = easyvqa.derive_caption([(row.question, row.answer) for row in image.rows])
            if caption is not None:
                caption = texts.get(caption, "caption")
            if caption is None:
                quarantine.add(split, image.ref, reason or "no_caption", len(image.rows),
                               note="questions of the image" if image.rows else "the image has no questions")
                del images[image_id]
                continue
            image.caption = caption
        for row in image.rows:
            row.caption = row.caption or image.caption


def _answers_conflict(a: _Image, b: _Image) -> bool:
    mine = {row.question: row.answer for row in a.rows}
    return any(row.question in mine and mine[row.question] != row.answer for row in b.rows)


def _deduplicate(images: Dict[str, Dict[int, _Image]], clean: CleaningConfig, quarantine: Quarantine,
                 near: bool) -> None:
    """Drop exact (near=False) or near (near=True) duplicate images; within a split the copy's rows move
    to the image it copies (a repeated question is then dropped as `duplicate` by `_final_rows`).

    The test split goes first and stays the reference: a train image that copies a test image is dropped
    with its rows (it would leak the test set into training). Exact copies are merged before captioning
    (they need no caption); near copies only when their captions agree and no shared question has another
    answer, so two renderings that look alike but mean different things are never merged.
    """
    if (near and clean.max_hash_distance < 0) or (not near and not clean.exact_duplicates):
        return
    seen: Dict[str, Tuple[str, int]] = {}
    index = cleaning.HashIndex(max(clean.max_hash_distance, 0))
    for split in ("test", "train"):
        for image_id in sorted(images[split]):
            image = images[split][image_id]
            match = _near_match(image, images, index, clean) if near else None
            if not near and image.facts.pixel_sha256 in seen:
                match = (seen[image.facts.pixel_sha256], "image_duplicate", 0, 0, "identical decoded pixels")
            if match is not None and (match[0][0] == split or clean.cross_split_duplicates):
                (other_split, other_id), reason, value, threshold, note = match
                other = images[other_split][other_id]
                leak = "" if other_split == split else f" ({other_split} split: dropped with its questions)"
                quarantine.add(split, image.ref, reason, value, threshold, note=f"{note} as {other.ref}{leak}")
                if other_split == split:
                    for row in image.rows:
                        row.image_id = other.image_id
                    other.rows.extend(image.rows)
                del images[split][image_id]
                continue
            seen.setdefault(image.facts.pixel_sha256, (split, image_id))
            index.add((split, image_id), image.facts.hash)


def _near_match(image: _Image, images: Dict[str, Dict[int, _Image]], index: cleaning.HashIndex,
                clean: CleaningConfig):
    """((split, id), reason, distance, threshold, note) of the closest earlier near-copy, or None."""
    for (other_split, other_id), distance in sorted(index.query(image.facts.hash), key=lambda m: m[1]):
        other = images[other_split][other_id]
        diff = cleaning.thumbnail_difference(image.facts, other.facts)
        if diff <= clean.max_pixel_difference and other.caption == image.caption \
                and not _answers_conflict(other, image):
            return ((other_split, other_id), "image_near_duplicate", distance, clean.max_hash_distance,
                    f"{clean.hash} distance {distance}, thumbnail difference {diff:.0f}")
    return None


def _align(images: Dict[str, Dict[int, _Image]], clean: CleaningConfig, report: BuildReport,
           quarantine: Quarantine, scorer: AlignmentScore) -> None:
    """Score every (image, caption) pair with a trained run; drop the rows of pairs below the threshold."""
    pairs = [(split, image_id, caption) for split in SPLITS for image_id in sorted(images[split])
             for caption in dict.fromkeys(row.caption for row in images[split][image_id].rows)]
    scores = scorer.score([images[s][i].data for s, i, _ in pairs], [c for _, _, c in pairs])
    dropped = 0
    for (split, image_id, caption), score in zip(pairs, scores):
        if score < clean.align_min_similarity:
            image = images[split][image_id]
            quarantine.add(split, image.ref, "misaligned", round(float(score), 4), clean.align_min_similarity,
                           note=f"caption {caption!r}")
            image.rows = [row for row in image.rows if row.caption != caption]
            dropped += 1
    for split in SPLITS:
        for image_id in [i for i, image in images[split].items() if not image.rows]:
            del images[split][image_id]
    quantiles = np.quantile(scores, [0.0, 0.1, 0.5, 0.9, 1.0]).round(4).tolist() if len(scores) else []
    report.alignment = {"checkpoint": clean.align_checkpoint, "min_similarity": clean.align_min_similarity,
                        "pairs": len(pairs), "dropped": dropped,
                        "quantiles_0_10_50_90_100": quantiles}


def _final_rows(images: Dict[int, _Image], quarantine: Quarantine, split: str) -> List[Tuple[_Image, _Row]]:
    """The split's rows in image-id order; a repeated (image, question) is dropped (`duplicate`, or
    `answer_conflict` when its answer differs from the first one)."""
    out = []
    for image_id in sorted(images):
        image = images[image_id]
        first: Dict[str, str] = {}
        for row in image.rows:
            if row.question in first:
                reason = "duplicate" if first[row.question] == row.answer else "answer_conflict"
                quarantine.add(split, row.ref, reason, note=f"image {image.ref}, question {row.question!r}, "
                               f"answer {row.answer!r} (first answer {first[row.question]!r})")
                continue
            first[row.question] = row.answer
            out.append((image, row))
    return out


# ----------------------------------------------------------------------------- 3. speech

def _speech_unit(work: Path, cfg: Config, final: Dict[str, List[Tuple[_Image, _Row]]], question_ids: Dict[str, int],
                 quarantine: Quarantine, report: BuildReport, progress: bool) -> List[Tuple[int, str, int, str]]:
    """Write speech.mindrecord (or reuse it from an interrupted build); returns (qid, voice, rate, split) per clip."""
    plan = _speech_plan(cfg, final, question_ids)
    unit = ResumeUnit(work, "speech", plan_digest(plan), [records.SPEECH_TABLE])
    done = unit.finished()
    if done is None:
        rows, drops, resampled = _make_clips(work, cfg, plan, progress)
        written = records.write_table(work / records.SPEECH_TABLE, records.SPEECH_SCHEMA, rows, "spoken questions")
        index = [(r["question_id"], r["voice"], r["rate"], r["split"]) for r in rows]
        done = unit.finish(written, {"clips": index, "drops": [dataclasses.asdict(d) for d in drops],
                                     "resampled": resampled})
    else:
        report.resumed.append(unit.name)
    quarantine.extend(cleaning.drop_from_dict(d) for d in done["payload"]["drops"])
    report.resampled = list(done["payload"]["resampled"])
    return [tuple(clip) for clip in done["payload"]["clips"]]


def _speech_plan(cfg: Config, final: Dict[str, List[Tuple[_Image, _Row]]], question_ids: Dict[str, int]) -> Dict:
    """User recordings per (split, question), and the questions espeak-ng must speak, in a fixed order."""
    user: List[Tuple[str, int, str, str]] = []  # (split, qid, path, ref of its first use)
    for split in SPLITS:
        seen: Set[Tuple[int, str]] = set()
        for _, row in final[split]:
            key = (question_ids[row.question], row.audio)
            if row.audio and key not in seen:
                seen.add(key)
                user.append((split, key[0], row.audio, row.ref))
    used = {split: sorted({question_ids[row.question] for _, row in final[split]}) for split in SPLITS}
    voices = {"train": (list(cfg.data.train_voices), sorted(int(r) for r in cfg.data.speech_rates)),
              "test": (list(cfg.data.test_voices), rates_for_test_voices(cfg.data.speech_rates))}
    questions = {i: q for q, i in question_ids.items()}
    return {"user": sorted(user, key=lambda u: (SPLITS.index(u[0]), u[1], u[2])),
            "user_files": {path: _file_digest(path) for _, _, path, _ in user},
            "used": used, "voices": voices, "questions": {str(i): questions[i] for s in SPLITS for i in used[s]},
            "preprocess": P.preprocess_dict(cfg.preprocess), "cleaning": dataclasses.asdict(cfg.data.cleaning)}


def _make_clips(work: Path, cfg: Config, plan: Dict, progress: bool) -> Tuple[List[Dict], List[Drop], List[Dict]]:
    """Check user clips, synthesise the missing ones, check those; rows for speech.mindrecord in plan order."""
    pre, clean = cfg.preprocess, cfg.data.cleaning
    rows: List[Dict] = []
    drops: List[Drop] = []
    resampled: List[Dict] = []
    has_user: Set[Tuple[str, int]] = set()
    seen_pcm: Set[Tuple[str, int, str]] = set()
    for split, qid, path, ref in plan["user"]:
        source = f"{ref} {Path(path).name}"
        if not Path(path).is_file():
            drops.append(Drop(split, source, "audio_missing", "no such file"))
            continue
        try:
            audio, rate = cleaning.read_audio(path, pre.sample_rate)
        except P.InputError as exc:
            drops.append(Drop(split, source, "bad_audio", str(exc),
                              copy=_quarantine_copy(work, f"{split}_audio_{_slug(ref)}{Path(path).suffix}",
                                                    Path(path).read_bytes())))
            continue
        problem = cleaning.audio_problem(audio, pre, clean, name=source)
        if problem is not None:
            copy = ""
            if problem[0] in ("audio_nonfinite", "bad_audio"):
                copy = _quarantine_copy(work, f"{split}_audio_{_slug(ref)}{Path(path).suffix}", Path(path).read_bytes())
            drops.append(Drop(split, source, *problem, copy=copy))
            continue
        if rate != pre.sample_rate:
            resampled.append({"split": split, "source": source, "from": rate, "to": pre.sample_rate})
        pcm = records.to_pcm16(audio)
        key = (split, qid, hashlib.sha256(pcm).hexdigest())
        if key in seen_pcm:
            continue
        seen_pcm.add(key)
        words = len([t for t, _ in cleaning.word_tokens(plan["questions"][str(qid)]) if any(c.isalnum() for c in t)])
        wpm = int(round(60.0 * words / (audio.size / pre.sample_rate)))
        rows.append({"question_id": qid, "voice": USER_VOICE, "rate": wpm, "split": split, "pcm": pcm})
        has_user.add((split, qid))

    jobs = [(qid, voice, rate, split) for split in SPLITS for qid in plan["used"][split]
            if (split, qid) not in has_user for voice in plan["voices"][split][0] for rate in plan["voices"][split][1]]
    with progress_bar(total=len(jobs), desc="speech", unit="clip", disable=not progress) as bar:
        spoken = speech.synthesize_fresh([(plan["questions"][str(qid)], voice, rate) for qid, voice, rate, _ in jobs],
                                         pre.sample_rate, workers=min(2, os.cpu_count() or 1),
                                         on_voice_done=bar.update)
    for (qid, voice, rate, split), (audio, error) in zip(jobs, spoken):
        source = f"espeak-ng {voice} at {rate} wpm: {plan['questions'][str(qid)]!r}"
        if audio is None:
            drops.append(Drop(split, source, "bad_audio", error))
            continue
        pcm = records.to_pcm16(audio)
        problem = cleaning.audio_problem(records.from_pcm16(pcm), pre, clean, name=source)  # as the loader reads it
        if problem is not None:
            drops.append(Drop(split, source, *problem))
            continue
        rows.append({"question_id": qid, "voice": voice, "rate": rate, "split": split, "pcm": pcm})
    return rows, drops, resampled


# ----------------------------------------------------------------------------- 4. shards

def _write_shards(work: Path, split: str, table: List[Tuple[_Image, _Row]], shards: int,
                  question_ids: Dict[str, int], caption_ids: Dict[str, int], answer_ids: Dict[str, int],
                  report: BuildReport, progress: bool) -> List[str]:
    """Write the split's rows into `shards` contiguous shards, skipping shards an interrupted build finished."""
    names = records.shard_names(split, shards)
    bar = progress_bar(total=len(table), desc=f"write {split}", unit="row", disable=not progress)
    for name, span in zip(names, records.shard_ranges(len(table), shards)):
        ids = [(i, table[i][0].image_id, question_ids[table[i][1].question], caption_ids[table[i][1].caption],
                answer_ids[table[i][1].answer]) for i in span]
        plan = {"rows": [(*row, table[i][0].sha256) for row, i in zip(ids, span)]}
        unit = ResumeUnit(work, name, plan_digest(plan), [name])
        if unit.finished() is not None:
            report.resumed.append(name)
            bar.update(len(span))
            continue

        def rows(ids=ids, span=span):
            for (sample_id, image_id, qid, cid, aid), i in zip(ids, span):
                bar.update(1)
                yield {"sample_id": sample_id, "image": table[i][0].data, "image_id": image_id,
                       "question_id": qid, "caption_id": cid, "answer_id": aid}

        written = records.write_table(work / name, records.EXAMPLE_SCHEMA, rows(), f"{split} examples, {name}")
        unit.finish(written, {})
    bar.close()
    return names


# ----------------------------------------------------------------------------- 5. conversations

def _user_conversations(work: Path, cfg: Config, src: SourceSplit, quarantine: Quarantine) -> List[ConversationSample]:
    """A folder's conversation lines, checked like its examples: a line that cannot be read, an image the
    loader could not decode or the image checks refuse, a clip the audio checks refuse, a repeated id:
    quarantined with the line; the clips stored as int16 PCM at the preprocess rate."""
    pre, clean = cfg.preprocess, cfg.data.cleaning
    kept: List[ConversationSample] = []
    seen: Dict[str, str] = {}
    for ref, obj in src.conversations:
        try:
            sample = parse_sample(obj, Path(src.folder), ref)
        except P.InputError as exc:
            quarantine.add(src.name, ref, "bad_conversation", str(exc))
            continue
        if sample.id in seen:
            quarantine.add(src.name, ref, "bad_conversation", f"id {sample.id!r} already used by {seen[sample.id]}")
            continue
        files = obj["image"] if isinstance(obj.get("image"), list) else [obj.get("image")]
        if any(_checked_image(work, src.name, ref, image, f"{src.name}_{_slug(ref)}_{Path(file).name}",
                              f"{ref} image {file}", clean, pre, quarantine) is None
               for image, file in zip(sample.images, files)):
            continue
        if sample.audio is not None:
            name = f"{ref} {obj['audio']}"
            try:
                audio, _ = cleaning.read_audio(sample.audio, pre.sample_rate, name=name)
                problem = cleaning.audio_problem(audio, pre, clean, name=name)
            except P.InputError as exc:
                problem = ("bad_audio", str(exc), None)
            if problem is not None:
                copy = ""
                if problem[0] in ("audio_nonfinite", "bad_audio"):
                    copy = _quarantine_copy(work, f"{src.name}_{_slug(ref)}_{Path(obj['audio']).name}", sample.audio)
                quarantine.add(src.name, ref, *problem, copy=copy)
                continue
            sample.audio = records.to_pcm16(audio)
        seen[sample.id] = ref
        kept.append(sample)
    return kept


def _write_conversations(work: Path, name: str, samples: List[ConversationSample], shards: int,
                         report: BuildReport, progress: bool) -> List[str]:
    """Write a split's conversations into `shards` contiguous shards, skipping those an interrupted build
    finished (as `_write_shards`)."""
    names = records.shard_names(name, shards)
    rows = [table_row(sample, i) for i, sample in enumerate(samples)]
    bar = progress_bar(total=len(rows), desc=f"write {name}", unit="row", disable=not progress)
    for file, span in zip(names, records.shard_ranges(len(rows), shards)):
        plan = {"rows": [{key: hashlib.sha256(value).hexdigest() if isinstance(value, bytes) else value
                          for key, value in rows[i].items()} for i in span]}
        unit = ResumeUnit(work, file, plan_digest(plan), [file])
        if unit.finished() is None:
            written = records.write_table(work / file, records.CONVERSATION_SCHEMA, (rows[i] for i in span),
                                          f"{name}, {file}")
            unit.finish(written, {})
        else:
            report.resumed.append(file)
        bar.update(len(span))
    bar.close()
    return names


def _file_digest(path: str) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return "missing"


# ----------------------------------------------------------------------------- helpers

def _check_voices(data: DataConfig) -> None:
    for key in ("train_voices", "test_voices"):
        for i, voice in enumerate(getattr(data, key)):
            try:
                speech.check_voice(voice)
            except speech.SpeechError as exc:
                raise ConfigError(f"data.{key}[{i}]: {exc}") from exc


def _quarantine_copy(work: Path, name: str, data: bytes) -> str:
    folder = work / "quarantine"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    return f"quarantine/{name}"


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_")


@contextmanager
def _stage(seconds: Dict[str, float], name: str):
    """Add the wall time of the block to seconds[name]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - start, 2)

