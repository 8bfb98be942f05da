"""`mindvl data build`: easy-VQA + synthesised spoken questions -> a cleaned MindRecord data root.

The root holds tokenizer.json, meta.json, speech.mindrecord (the clip table), train.mindrecord,
test.mindrecord (one row per image and question), quarantine/ (source images that failed to decode)
and report.json (counts, skips by reason, timings, and the settings that produced them).

Bad inputs never stop the build; each is counted under a reason in the report:
  bad_image          source images that are missing or do not decode (copied to quarantine/)
  no_caption         images whose questions do not name both the shape and the colour
  caption_conflict   images whose answers contradict each other about shape or colour
  bad_audio          synthesised clips that are empty, silent or longer than preprocess.max_audio_frames
  question_too_long  examples whose question exceeds preprocess.max_text_length tokens
  no_audio           examples whose question has no usable clip in the split's voices
  unknown_answer     examples whose answer is not one of easy-VQA's 13 answers
  duplicate          repeated (image_id, question) examples
Image reasons count images, bad_audio counts clips, the others count examples.

The build writes into a temporary sibling folder and renames it into place at the end, so an
interrupted build never leaves a root that looks complete. A complete root built with the same settings
is reused unless `force=True`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from tqdm import tqdm

from mindvl import preprocess as P
from mindvl.config import Config, ConfigError
from mindvl.data import easyvqa, records, speech

FORMAT_VERSION = 1
DATA_FILES = ("tokenizer.json", "meta.json", "speech.mindrecord", "speech.mindrecord.db", "train.mindrecord",
              "train.mindrecord.db", "test.mindrecord", "test.mindrecord.db", "report.json")
SKIP_REASONS = ("bad_image", "no_caption", "caption_conflict", "bad_audio", "question_too_long", "no_audio",
                "unknown_answer", "duplicate")


@dataclass
class BuildReport:
    """What a build produced and dropped; also written as `<root>/report.json`."""

    root: str
    settings: Dict = field(default_factory=dict)
    counts: Dict[str, Dict[str, int]] = field(default_factory=dict)  # split -> {"images", "examples", ...}
    skips: Dict[str, int] = field(default_factory=dict)  # reason -> count (see the module docstring)
    skips_by_split: Dict[str, Dict[str, int]] = field(default_factory=dict)
    voices: Dict[str, List[str]] = field(default_factory=dict)  # split -> voices used
    rates: Dict[str, List[int]] = field(default_factory=dict)  # split -> speech rates used (words/minute)
    quarantined: List[str] = field(default_factory=list)
    seconds: Dict[str, float] = field(default_factory=dict)  # stage -> wall seconds, and "total"
    already_built: bool = False

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict) -> "BuildReport":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def summary(self) -> str:
        lines = [f"data root {self.root}" + (" (already built)" if self.already_built else "")]
        for split in easyvqa.SPLITS:
            c = self.counts.get(split, {})
            lines.append(f"  {split}: {c.get('examples', 0)} examples from {c.get('images_used', 0)}/"
                         f"{c.get('images', 0)} images, {c.get('questions', 0)} questions, "
                         f"voices {self.voices.get(split)} at {self.rates.get(split)} wpm")
        lines.append(f"  speech clips: {self.counts.get('speech', {}).get('clips', 0)}")
        skipped = {k: v for k, v in self.skips.items() if v}
        lines.append(f"  skipped: {skipped or 'nothing'}")
        if self.seconds:
            lines.append(f"  seconds: {self.seconds}")
        return "\n".join(lines)


def build_settings(cfg: Config, limit: int) -> Dict:
    """Everything that determines a build's content; a root is reused only if these match."""
    return {
        "format": FORMAT_VERSION,
        "source": "easy-vqa",
        "limit": int(limit),
        "train_voices": list(cfg.data.train_voices),
        "test_voices": list(cfg.data.test_voices),
        "speech_rates": [int(r) for r in cfg.data.speech_rates],
        "preprocess": P.preprocess_dict(cfg.preprocess),
    }


def is_complete(root: Union[str, Path]) -> bool:
    """True when `root` holds every file a finished build writes."""
    root = Path(root)
    return all((root / name).is_file() for name in DATA_FILES)


def read_report(root: Union[str, Path]) -> Optional[BuildReport]:
    path = Path(root) / "report.json"
    try:
        return BuildReport.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def rates_for_test_voices(rates: List[int]) -> List[int]:
    """Test voices speak at the middle rate only: new speakers are the point, not new speeds."""
    ordered = sorted(int(r) for r in rates)
    return [ordered[len(ordered) // 2]]


def build_dataset(cfg: Config, root: Union[str, Path, None] = None, limit: Optional[int] = None,
                  progress: bool = True, force: bool = False) -> BuildReport:
    """Build the data root `root` (default cfg.data.root) from easy-VQA; see the module docstring.

    `limit`: at most this many source images per split (default cfg.data.limit; 0: all), keeping every
    question of the kept images.
    """
    started = time.perf_counter()
    root = Path(root if root is not None else cfg.data.root)
    limit = cfg.data.limit if limit is None else int(limit)
    if limit < 0:
        raise ConfigError(f"data.limit: expected >= 0 (0 means all), got {limit}")
    settings = build_settings(cfg, limit)
    if not force and is_complete(root):
        previous = read_report(root)
        if previous is not None and previous.settings == settings:
            previous.already_built = True
            previous.root = str(root)
            return previous
    _check_voices(cfg)
    _check_replaceable(root)

    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    work = root.parent / f".{root.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        report = _build_into(work, cfg, settings, limit, progress)
        report.root = str(root)
        report.seconds["total"] = round(time.perf_counter() - started, 2)
        (work / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
        _swap_into_place(work, root)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return report


# ----------------------------------------------------------------------------- the build proper

def _build_into(work: Path, cfg: Config, settings: Dict, limit: int, progress: bool) -> BuildReport:
    pre = cfg.preprocess
    report = BuildReport(root=str(work), settings=settings)
    skips = {split: Counter() for split in (*easyvqa.SPLITS, "speech")}

    # 1. sources, vocabulary and ids (question and answer ids do not depend on `limit`)
    with _stage(report.seconds, "sources"):
        answers = easyvqa.answers()
        sources = {split: easyvqa.load_split(split, limit) for split in easyvqa.SPLITS}
        texts = easyvqa.all_texts()
        questions = easyvqa.all_questions()
        captions_of = {split: _captions(src, skips[split]) for split, src in sources.items()}
        captions = sorted({c for per_split in captions_of.values() for c in per_split.values()})
        tokenizer = P.build_word_tokenizer([*texts, *captions])
        tokenizer.save(work / "tokenizer.json")
        too_long = _too_long(tokenizer, questions, pre.max_text_length)

    # 2. speech: every question an example will use, in every voice and rate of its split
    with _stage(report.seconds, "speech"):
        used = {split: {q for q in src.questions if q not in too_long} for split, src in sources.items()}
        jobs = _speech_jobs(cfg, questions, used)
        clip_rows, bad_audio = _synthesize(jobs, questions, pre, progress)
        skips["speech"]["bad_audio"] += bad_audio
        records.write_table(work / "speech.mindrecord", records.SPEECH_SCHEMA, clip_rows, "spoken questions")
        has_clip = {split: {r["question_id"] for r in clip_rows if r["split"] == split} for split in easyvqa.SPLITS}

    # 3. examples: decode every image, drop what cannot be used, write one table per split
    counts: Dict[str, Dict[str, int]] = {}
    for split, src in sources.items():
        with _stage(report.seconds, f"write_{split}"):
            used_questions: set = set()  # filled while the rows stream into the writer
            rows, images_used = _examples(
                work, src, captions_of[split], captions, questions, answers, too_long, has_clip[split], pre,
                skips[split], report.quarantined, used_questions, progress)
            written = records.write_table(work / f"{split}.mindrecord", records.EXAMPLE_SCHEMA, rows,
                                          f"easy-VQA {split}")
        counts[split] = {"images": len(src.image_paths), "images_used": images_used, "examples": written,
                         "questions": len(used_questions),
                         "captions": len(set(captions_of[split].values()))}
    counts["speech"] = {"clips": len(clip_rows),
                        **{f"{split}_clips": sum(r["split"] == split for r in clip_rows) for split in easyvqa.SPLITS}}

    report.counts = counts
    report.skips = {reason: sum(s[reason] for s in skips.values()) for reason in SKIP_REASONS}
    report.skips_by_split = {split: {k: v for k, v in s.items() if v} for split, s in skips.items()}
    report.voices = {"train": list(cfg.data.train_voices), "test": list(cfg.data.test_voices)}
    report.rates = {"train": sorted(int(r) for r in cfg.data.speech_rates),
                    "test": rates_for_test_voices(cfg.data.speech_rates)}

    meta = {
        "format": FORMAT_VERSION,
        "answers": answers,
        "questions": questions,
        "captions": captions,
        "train_voices": report.voices["train"],
        "test_voices": report.voices["test"],
        "speech_rates": [int(r) for r in cfg.data.speech_rates],
        "test_speech_rates": report.rates["test"],
        "preprocess": P.preprocess_dict(pre),
        "counts": counts,
    }
    (work / "meta.json").write_text(json.dumps(meta, indent=2))
    return report


def _captions(src: easyvqa.SourceSplit, skips: Counter) -> Dict[int, str]:
    """image id -> caption for images whose questions name shape and colour; the rest are counted."""
    pairs = defaultdict(list)
    for q, a, image_id in zip(src.questions, src.answers, src.image_ids):
        pairs[image_id].append((q, a))
    captions = {}
    for image_id in sorted(src.image_paths):
        caption, reason = easyvqa.derive_caption(pairs.get(image_id, []))
        if caption is None:
            skips[reason] += 1
        else:
            captions[image_id] = caption
    return captions


def _too_long(tokenizer: P.TextTokenizer, questions: List[str], max_length: int) -> set:
    too_long = set()
    for q in questions:
        try:
            tokenizer.encode(q, max_length)
        except P.InputError:
            too_long.add(q)
    return too_long


def _speech_jobs(cfg: Config, questions: List[str], used: Dict[str, set]) -> List[Tuple[int, str, int, str]]:
    """(question_id, voice, rate, split) for every clip to synthesise, each distinct one once."""
    jobs = []
    plan = {"train": (cfg.data.train_voices, sorted(int(r) for r in cfg.data.speech_rates)),
            "test": (cfg.data.test_voices, rates_for_test_voices(cfg.data.speech_rates))}
    for split, (voices, rates) in plan.items():
        for qid in sorted(questions.index(q) for q in used[split]):
            for voice in voices:
                for rate in rates:
                    jobs.append((qid, voice, rate, split))
    return list(dict.fromkeys(jobs))


def _synthesize(jobs, questions: List[str], pre, progress: bool) -> Tuple[List[Dict], int]:
    rows, bad = [], 0
    for qid, voice, rate, split in tqdm(jobs, desc="speech", unit="clip", disable=not progress):
        audio = speech.synthesize(questions[qid], voice, rate, pre.sample_rate)
        pcm = speech.to_pcm16(audio)
        try:  # validate exactly what the loader will compute from the stored int16 clip
            P.pad_mel(P.log_mel(speech.from_pcm16(pcm), pre, name=f"clip {voice}@{rate}"), pre)
        except P.InputError:
            bad += 1
            continue
        rows.append({"question_id": qid, "voice": voice, "rate": rate, "split": split, "pcm": pcm})
    return rows, bad


def _examples(work: Path, src: easyvqa.SourceSplit, captions_of: Dict[int, str], captions: List[str],
              questions: List[str], answers: List[str], too_long: set, has_clip: set, pre, skips: Counter,
              quarantined: List[str], used_questions: set, progress: bool):
    """Yield example rows lazily (the writer streams them); returns (row generator, used image count)."""
    by_image = defaultdict(list)
    for q, a, image_id in zip(src.questions, src.answers, src.image_ids):
        by_image[image_id].append((q, a))
    caption_ids = {c: i for i, c in enumerate(captions)}
    question_ids = {q: i for i, q in enumerate(questions)}
    answer_ids = {a: i for i, a in enumerate(answers)}

    images: Dict[int, bytes] = {}
    for image_id in tqdm(sorted(src.image_paths), desc=f"images {src.name}", unit="img", disable=not progress):
        path = Path(src.image_paths[image_id])
        try:
            data = path.read_bytes()
            P.decode_image(data, pre, name=f"{src.name} image {image_id} ({path})")
        except (OSError, P.InputError):
            skips["bad_image"] += 1
            _quarantine(work, src.name, image_id, path, quarantined)
            continue
        if image_id in captions_of:
            images[image_id] = data

    def rows():
        seen = set()
        sample_id = 0
        for image_id in sorted(images):
            for q, a in by_image.get(image_id, []):
                key = (image_id, q)
                if key in seen:
                    skips["duplicate"] += 1
                    continue
                seen.add(key)
                if q in too_long:
                    skips["question_too_long"] += 1
                elif question_ids[q] not in has_clip:
                    skips["no_audio"] += 1
                elif a not in answer_ids:
                    skips["unknown_answer"] += 1
                else:
                    used_questions.add(question_ids[q])
                    yield {"sample_id": sample_id, "image": images[image_id], "image_id": image_id,
                           "question_id": question_ids[q], "caption_id": caption_ids[captions_of[image_id]],
                           "answer_id": answer_ids[a]}
                    sample_id += 1

    total = sum(len(by_image.get(i, [])) for i in images)
    return tqdm(rows(), total=total, desc=f"write {src.name}", unit="row", disable=not progress), len(images)


def _quarantine(work: Path, split: str, image_id: int, path: Path, quarantined: List[str]) -> None:
    folder = work / "quarantine"
    folder.mkdir(exist_ok=True)
    target = folder / f"{split}_{image_id}{path.suffix or '.bin'}"
    try:
        shutil.copyfile(path, target)
    except OSError:  # a missing source: record it anyway
        target.write_bytes(b"")
    quarantined.append(f"quarantine/{target.name}")


# ----------------------------------------------------------------------------- safety around the root

def _check_voices(cfg: Config) -> None:
    for key in ("train_voices", "test_voices"):
        for i, voice in enumerate(getattr(cfg.data, key)):
            try:
                speech.check_voice(voice)
            except speech.SpeechError as exc:
                raise ConfigError(f"data.{key}[{i}]: {exc}") from exc


def _check_replaceable(root: Path) -> None:
    """Refuse to replace a folder that is not a (possibly partial) mindvl data root."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"data.root: {root} exists and is not a folder; choose another data.root")
    if root.is_dir() and any(root.iterdir()) and not any((root / name).exists()
                                                         for name in ("report.json", "meta.json")):
        raise ConfigError(f"data.root: {root} is a non-empty folder that is not a mindvl data set; "
                          f"choose another data.root or empty it")


def _remove_stale_partials(root: Path) -> None:
    for path in root.parent.glob(f".{root.name}.partial-*"):
        try:
            pid = int(path.name.rsplit("-", 1)[1])
            os.kill(pid, 0)  # that build is still running: leave it alone
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def _swap_into_place(work: Path, root: Path) -> None:
    old = None
    if root.exists():
        old = root.parent / f".{root.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        root.rename(old)
    work.rename(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _stage(seconds: Dict[str, float], name: str):
    """Add the wall time of the block to seconds[name]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - start, 2)
