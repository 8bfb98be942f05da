"""The checks `mindvl data build` runs on every image, clip and text before it is written.

Each check measures one number, compares it with a threshold from `CleaningConfig` (data.cleaning) and,
when the item fails, the build drops it and appends a `Drop` to `<root>/quarantine.jsonl`:
{"split", "unit", "source", "reason", "value" (the measured number or error), "threshold", "note"}.
`REASONS` lists every reason with the unit it counts (an image, an example row, a clip, a JSONL line,
a caption or an image-caption pair).

Images: a decode error or truncation; identical decoded pixels (sha256, so a re-saved PNG is caught);
near-copies (64-bit pHash or dHash within `max_hash_distance`, confirmed on 16x16 RGB thumbnails,
see `near_duplicate`); low information (entropy of the colour histogram) and blur (variance of the
Laplacian, the largest over R, G and B: a yellow shape on a pale background is sharp in blue, nearly
invisible in grey).
Audio (mono float32 at the preprocess rate): empty, non-finite samples, too short, too long for
preprocess.max_audio_frames, silent (RMS in dBFS), clipped (fraction of samples at full scale).
Text: `normalize_text` (NFKC, typographic quotes and dashes to ASCII, lower case, one space between
words: the tokenizer's own normalisation, done once so meta.json holds what the model sees), then token
length, word count and characters outside `alphabet`.
Alignment: `AlignmentScorer` embeds images and captions with a trained mindvl run (cosine similarity).
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.config import CleaningConfig, PreprocessConfig

# reason -> (unit it counts, what it means)
REASONS: Dict[str, Tuple[str, str]] = {
    "bad_line": ("line", "a JSONL line that is not a JSON object with string image/question/answer"),
    "bad_conversation": ("conversation", "a conversation line that cannot be used (turns out of order, "
                                         "placeholders that do not match its files, a missing file, a repeated id)"),
    "image_missing": ("image", "the image file does not exist"),
    "bad_image": ("image", "the image does not decode (garbage, truncated, unsupported); copied to quarantine/"),
    "image_low_information": ("image", "colour-histogram entropy below min_entropy bits (blank or nearly)"),
    "image_blurry": ("image", "variance of the Laplacian below min_sharpness"),
    "image_duplicate": ("image", "decoded pixels identical to an earlier image (its questions move to that one)"),
    "image_near_duplicate": ("image", "perceptual hash and thumbnail within the thresholds of an earlier image "
                                      "with the same caption and no conflicting answer"),
    "no_caption": ("image", "no caption given and the image's questions do not name both shape and colour"),
    "caption_conflict": ("image", "the image's answers contradict each other about shape or colour"),
    "misaligned": ("pair", "cosine similarity of image and caption below align_min_similarity"),
    "question_too_long": ("example", "more tokens with [CLS]/[SEP] than preprocess.max_text_length"),
    "question_too_short": ("example", "fewer words than min_words"),
    "question_charset": ("example", "characters outside the alphabet (fraction of non-space characters)"),
    "answer_too_long": ("example", "more tokens with [BOS]/[EOS] than preprocess.max_answer_length"),
    "answer_too_short": ("example", "an empty answer"),
    "answer_charset": ("example", "characters outside the alphabet"),
    "unknown_answer": ("example", "the answer is not one of the source's answers"),
    "duplicate": ("example", "the (image, question) pair appeared before with the same answer"),
    "answer_conflict": ("example", "the (image, question) pair appeared before with another answer"),
    "no_audio": ("example", "no usable clip of the question in the split's voices"),
    "caption_too_long": ("caption", "more tokens with [CLS]/[SEP] than preprocess.max_text_length"),
    "caption_too_short": ("caption", "an empty caption"),
    "caption_charset": ("caption", "characters outside the alphabet"),
    "audio_missing": ("clip", "the audio file does not exist"),
    "bad_audio": ("clip", "the audio does not decode or the loader's log-mel rejects it; copied to quarantine/"),
    "audio_empty": ("clip", "no samples"),
    "audio_nonfinite": ("clip", "NaN or infinite samples (count); copied to quarantine/"),
    "audio_too_short": ("clip", "shorter than min_audio_seconds"),
    "audio_too_long": ("clip", "longer than preprocess.max_audio_frames allow (seconds)"),
    "audio_silent": ("clip", "RMS level below silence_dbfs"),
    "audio_clipped": ("clip", "more samples at full scale than max_clipped_fraction"),
}


# ----------------------------------------------------------------------------- the quarantine log

@dataclass
class Drop:
    """One dropped item: a line of quarantine.jsonl."""

    split: str
    source: str  # a path, "train.jsonl:12", or an id such as "easy-vqa train image 17"
    reason: str  # a key of REASONS
    value: Any = None  # what was measured (a number, or the error text)
    threshold: Any = None
    note: str = ""
    copy: str = ""  # quarantine/<file> when the source file was copied there

    @property
    def unit(self) -> str:
        return REASONS[self.reason][0]

    def to_json(self) -> str:
        record = {"split": self.split, "unit": self.unit, **asdict(self)}
        record = {k: v for k, v in record.items() if v not in ("", None) or k in ("value", "threshold")}
        return json.dumps(record, ensure_ascii=False, default=_jsonable)


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


class Quarantine:
    """Every drop of a build, in the order the build found them (which is deterministic)."""

    def __init__(self) -> None:
        self.drops: List[Drop] = []

    def add(self, split: str, source: str, reason: str, value: Any = None, threshold: Any = None,
            note: str = "", copy: str = "") -> Drop:
        if reason not in REASONS:
            raise KeyError(f"unknown drop reason {reason!r}; add it to cleaning.REASONS")
        if isinstance(value, float):
            value = round(value, 6)
        drop = Drop(split, source, reason, value, threshold, note, copy)
        self.drops.append(drop)
        return drop

    def extend(self, drops: Iterable[Drop]) -> None:
        self.drops.extend(drops)

    def counts(self) -> Dict[str, Counter]:
        """split -> Counter(reason -> number of items dropped)."""
        out: Dict[str, Counter] = defaultdict(Counter)
        for drop in self.drops:
            out[drop.split][drop.reason] += 1
        return out

    def write(self, path: Union[str, Path]) -> None:
        text = "".join(drop.to_json() + "\n" for drop in self.drops)
        Path(path).write_text(text, encoding="utf-8")


def drop_from_dict(record: Dict) -> Drop:
    return Drop(record["split"], record["source"], record["reason"], record.get("value"), record.get("threshold"),
                record.get("note", ""), record.get("copy", ""))


# ----------------------------------------------------------------------------- images

THUMB = 16  # thumbnail side for the near-duplicate confirmation
_OBJECT_ADDRESS = re.compile(r" ?<[^<>]* at 0x[0-9a-f]+>")
HASH_BITS = 64


@dataclass
class ImageFacts:
    """What the cleaning passes measure on one decoded image."""

    width: int
    height: int
    pixel_sha256: str  # of the RGB pixels and the size: a re-encoded lossless copy has the same
    hash: int  # 64-bit perceptual hash (pHash or dHash of the grey image)
    thumb: np.ndarray  # (THUMB, THUMB, 3) uint8, box-filtered
    entropy: float  # bits of the RGB colour histogram
    sharpness: float  # variance of the 4-neighbour Laplacian, the largest over R, G, B


def inspect_image(data: bytes, hash_kind: str = "phash", name: str = "image") -> ImageFacts:
    """Decode `data` fully and measure it; raises `P.InputError` for garbage, truncated or empty files."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise P.InputError(f"{name}: the file is empty")
    try:
        with Image.open(io.BytesIO(data)) as probe:
            fmt = probe.format
            probe.verify()  # PNG: walks every chunk and its CRC, so a cut-off file fails here
        if fmt == "JPEG" and b"\xff\xd9" not in data[-64:]:
            # Pillow fills a cut-off JPEG with grey when ImageFile.LOAD_TRUNCATED_IMAGES is set anywhere
            raise P.InputError(f"{name}: truncated JPEG (no end-of-image marker)")
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            rgb = img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        message = _OBJECT_ADDRESS.sub("", str(exc))  # Pillow names the BytesIO by its address
        raise P.InputError(f"{name}: cannot decode ({type(exc).__name__}: {message})") from exc
    pixels = np.asarray(rgb, dtype=np.uint8)  # (H, W, 3)
    digest = hashlib.sha256(f"{rgb.size[0]}x{rgb.size[1]}:".encode() + pixels.tobytes()).hexdigest()
    grey = rgb.convert("L")
    return ImageFacts(width=rgb.size[0], height=rgb.size[1], pixel_sha256=digest,
                      hash=phash(grey) if hash_kind == "phash" else dhash(grey),
                      thumb=np.asarray(rgb.resize((THUMB, THUMB), Image.BOX), dtype=np.uint8),
                      entropy=colour_entropy(pixels), sharpness=laplacian_variance(pixels))


@lru_cache(maxsize=2)
def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m  # orthonormal DCT-II: coeffs = m @ x @ m.T


def _bits_to_int(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits.astype(np.uint8)).tobytes(), "big")


def phash(grey) -> int:
    """64-bit DCT hash (as imagehash.phash): 32x32 Lanczos grey, top-left 8x8 DCT coefficients > their median."""
    from PIL import Image

    small = np.asarray(grey.resize((32, 32), Image.LANCZOS), dtype=np.float64)
    d = _dct_matrix(32)
    low = (d @ small @ d.T)[:8, :8]
    return _bits_to_int((low > np.median(low)).ravel())


def dhash(grey) -> int:
    """64-bit gradient hash: 9x8 Lanczos grey, is each pixel brighter than its left neighbour."""
    from PIL import Image

    small = np.asarray(grey.resize((9, 8), Image.LANCZOS), dtype=np.float64)
    return _bits_to_int((small[:, 1:] > small[:, :-1]).ravel())


def hamming(a: int, b: int) -> int:
    return bin(a ^ b).count("1")


def colour_entropy(pixels: np.ndarray) -> float:
    """Shannon entropy (bits) of the distribution of exact RGB colours; 0 for a one-colour image."""
    flat = pixels.reshape(-1, 3).astype(np.int64)
    codes = (flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]
    _, counts = np.unique(codes, return_counts=True)
    p = counts / counts.sum()
    return float(max(0.0, -(p * np.log2(p)).sum()))


def laplacian_variance(pixels: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian per channel (0..255 scale), the largest of R, G, B."""
    a = pixels.astype(np.float64)
    if a.shape[0] < 3 or a.shape[1] < 3:
        return 0.0
    lap = a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:] - 4.0 * a[1:-1, 1:-1]  # (H-2, W-2, 3)
    return float(lap.reshape(-1, 3).var(axis=0).max())


def image_quality_problem(facts: ImageFacts, cfg: CleaningConfig) -> Optional[Tuple[str, float, float]]:
    """(reason, measured, threshold) for a low-information or blurry image, else None."""
    if cfg.min_entropy > 0 and facts.entropy < cfg.min_entropy:
        return "image_low_information", round(facts.entropy, 4), cfg.min_entropy
    if cfg.min_sharpness > 0 and facts.sharpness < cfg.min_sharpness:
        return "image_blurry", round(facts.sharpness, 3), cfg.min_sharpness
    return None


def thumbnail_difference(a: ImageFacts, b: ImageFacts) -> float:
    """The largest absolute difference between two thumbnails' pixels (0..255, any channel)."""
    return float(np.abs(a.thumb.astype(np.int16) - b.thumb.astype(np.int16)).max())


class HashIndex:
    """Near-duplicate candidates by Hamming distance on 64-bit hashes (multi-index hashing).

    The hash is cut into max_distance + 1 bands: two hashes within the distance agree exactly on at
    least one band (pigeonhole), so lookups touch only items sharing a band, not every item.
    """

    def __init__(self, max_distance: int) -> None:
        self.max_distance = max_distance
        bands = max_distance + 1
        edges = np.linspace(0, HASH_BITS, bands + 1).round().astype(int)
        self.bands = [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
        self.tables: List[Dict[int, List[int]]] = [defaultdict(list) for _ in self.bands]
        self.hashes: List[int] = []
        self.keys: List[Any] = []

    def _band(self, value: int, lo: int, hi: int) -> int:
        return (value >> (HASH_BITS - hi)) & ((1 << (hi - lo)) - 1)

    def add(self, key: Any, value: int) -> None:
        slot = len(self.hashes)
        self.hashes.append(value)
        self.keys.append(key)
        for table, (lo, hi) in zip(self.tables, self.bands):
            table[self._band(value, lo, hi)].append(slot)

    def query(self, value: int) -> List[Tuple[Any, int]]:
        """(key, distance) of every stored hash within max_distance, in insertion order."""
        slots = set()
        for table, (lo, hi) in zip(self.tables, self.bands):
            slots.update(table.get(self._band(value, lo, hi), ()))
        found = []
        for slot in sorted(slots):
            distance = hamming(value, self.hashes[slot])
            if distance <= self.max_distance:
                found.append((self.keys[slot], distance))
        return found


# ----------------------------------------------------------------------------- audio

CLIP_LEVEL = 0.999  # |sample| at or above this fraction of full scale counts as clipped


def rms_dbfs(audio: np.ndarray) -> float:
    """RMS level in dB relative to full scale (a full-scale sine is -3 dBFS); -inf for digital silence."""
    if audio.size == 0:
        return float("-inf")
    rms = float(np.sqrt(np.mean(np.square(audio.astype(np.float64)))))
    return 20.0 * np.log10(rms) if rms > 0 else float("-inf")


def audio_problem(audio: np.ndarray, pre: PreprocessConfig, cfg: CleaningConfig,
                  name: str = "clip") -> Optional[Tuple[str, Any, Any]]:
    """(reason, measured, threshold) for a mono float32 clip at pre.sample_rate that must be dropped, else None.

    The last check runs the loader's own log-mel on the clip, so a kept clip never fails in training.
    """
    audio = np.asarray(audio)
    if audio.size == 0:
        return "audio_empty", 0, 1
    bad = int(np.count_nonzero(~np.isfinite(audio)))
    if bad:
        return "audio_nonfinite", bad, 0
    seconds = audio.size / pre.sample_rate
    if seconds < cfg.min_audio_seconds:
        return "audio_too_short", round(seconds, 4), cfg.min_audio_seconds
    frames = audio.size // pre.hop_length
    if frames > pre.max_audio_frames:
        return "audio_too_long", round(seconds, 4), round(P.audio_seconds(pre.max_audio_frames, pre), 4)
    level = rms_dbfs(audio)
    if level < cfg.silence_dbfs:
        return "audio_silent", round(level, 2) if np.isfinite(level) else "-inf", cfg.silence_dbfs
    clipped = float(np.mean(np.abs(audio) >= CLIP_LEVEL))
    if clipped > cfg.max_clipped_fraction:
        return "audio_clipped", round(clipped, 4), cfg.max_clipped_fraction
    try:
        P.speech_features(audio, pre, name=name)
    except P.InputError as exc:
        return "bad_audio", str(exc), None
    return None


def read_audio(path: Union[str, Path, bytes], sample_rate: int, name: str = "") -> Tuple[np.ndarray, int]:
    """A user audio file (its path, or its bytes named `name`) as mono float32 at `sample_rate` and its
    original rate.

    Non-finite samples are returned as they are (resampling would smear or reject them); otherwise the
    clip is resampled by `preprocess.load_wav`, exactly as the serving path does. Raises `P.InputError`
    for a file soundfile cannot read.
    """
    import soundfile

    label = name or str(path)
    try:
        if isinstance(path, bytes):
            info, (raw, rate) = soundfile.info(io.BytesIO(path)), soundfile.read(io.BytesIO(path), dtype="float32",
                                                                                  always_2d=True)
        else:
            info = soundfile.info(str(path))
            raw, rate = soundfile.read(str(path), dtype="float32", always_2d=True)  # (samples, channels)
    except (RuntimeError, OSError, ValueError, TypeError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise P.InputError(f"{label}: cannot read the audio ({exc})") from exc
    if raw.size == 0 or not np.all(np.isfinite(raw)):
        return raw.mean(axis=1) if raw.size else np.zeros(0, np.float32), int(info.samplerate)
    return P.load_wav(path, sample_rate, name=name or None), int(rate)


# ----------------------------------------------------------------------------- text

_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                             "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"',
                             "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
                             "\u2212": "-", "\u00a0": " "})
_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFKC, typographic quotes and dashes to ASCII, lower case, single spaces, stripped."""
    text = unicodedata.normalize("NFKC", text).translate(_TYPOGRAPHY).lower()
    return _SPACE.sub(" ", text).strip()


@lru_cache(maxsize=1)
def _pre_tokenizer():
    from tokenizers import pre_tokenizers

    # the word tokenizer's own pre-tokenisation (preprocess.build_word_tokenizer)
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])


def word_tokens(text: str) -> List[Tuple[str, Tuple[int, int]]]:
    """The tokens the word tokenizer will see in normalised `text`, with their character spans."""
    return _pre_tokenizer().pre_tokenize_str(text)


@dataclass
class TextCheck:
    text: Optional[str]  # the cleaned text, or None when dropped
    reason: str = ""
    value: Any = None
    threshold: Any = None


def clean_text(text: str, field: str, max_tokens: int, min_words: int, cfg: CleaningConfig,
               count_tokens: Optional[Callable[[str], int]] = None) -> TextCheck:
    """Normalise and check one question / answer / caption (`field`).

    max_tokens counts the two special tokens the encoder adds ([CLS]/[SEP] or [BOS]/[EOS]); the tokens
    are the word tokenizer's unless `count_tokens(text)` (special tokens included) counts them, as a
    pretrained subword tokenizer does (data.tokenizer). Words holding
    characters outside cfg.alphabet become the [UNK] token (unknown_chars "unk", up to
    max_unknown_fraction of the non-space characters) or drop the text.
    """
    text = normalize_text(text)
    tokens = word_tokens(text)
    words = [t for t, _ in tokens if any(ch.isalnum() for ch in t)]
    if len(words) < max(min_words, 1):
        return TextCheck(None, f"{field}_too_short", len(words), max(min_words, 1))
    count = count_tokens(text) if count_tokens else len(tokens) + 2
    if count > max_tokens:
        return TextCheck(None, f"{field}_too_long", count, max_tokens)
    alphabet = set(cfg.alphabet)
    chars = [ch for ch in text if not ch.isspace()]
    unknown = [ch for ch in chars if ch not in alphabet]
    if unknown:
        fraction = round(len(unknown) / len(chars), 4)
        limit = 0.0 if cfg.unknown_chars == "drop" else cfg.max_unknown_fraction
        if cfg.unknown_chars == "drop" or fraction > limit:
            return TextCheck(None, f"{field}_charset", fraction, limit)
        for token, (start, end) in reversed(tokens):  # right to left keeps the earlier spans valid
            if any(ch not in alphabet for ch in token):
                text = text[:start] + P.UNK + text[end:]
    return TextCheck(text)


def vocabulary_text(text: str) -> str:
    """`text` without [UNK] markers: what the tokenizer's vocabulary is trained on."""
    return text.replace(P.UNK, " ")
