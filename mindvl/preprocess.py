"""The one place where bytes become arrays: images, audio and text.

The data loader, the server and the device path all call these functions with the `PreprocessConfig`
that the model package's manifest records, so what the model sees in training is exactly what it sees
when deployed. Every function raises `InputError` (a `ValueError`) naming the offending item and what to
do about it, never a bare library exception.

Conventions (the C++ device runner mirrors them):
- image: RGB, bicubic resize to (image_size, image_size), [0, 1], then (x - mean) / std; float32 (3, S, S).
- audio: mono float32 at `sample_rate`; Whisper's log-mel (librosa STFT, hann, centred with reflect
  padding, power spectrum without the last frame, slaney mel filters, log10 clamped to max - 8,
  then (x + 4) / 4); float32 (n_mels, frames) with frames = len(waveform) // hop_length.
- text: a word-level `tokenizers` tokenizer; questions are [CLS] words [SEP], answers [BOS] words [EOS],
  both padded with [PAD] = 0.
- a request (image bytes, a typed and/or spoken question) becomes the vqa graph's inputs through
  `RequestInputs`, the stages both the generated servable and the device pipeline run.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindvl.config import PreprocessConfig
from mindvl.errors import InputError

if TYPE_CHECKING:  # PIL is imported lazily: the text-only paths never need it
    from PIL import Image

__all__ = ["InputError", "RequestInputs", "expect", "decode_image", "open_image", "limit_decodes", "resize_image", "image_to_array", "log_mel", "whisper_log_mel",
           "pad_mel", "load_wav", "audio_seconds", "TextTokenizer", "build_word_tokenizer", "SPECIAL_TOKENS"]

SILENCE_PEAK = 1e-4  # a clip whose peak |amplitude| is below this is treated as silent
# OpenAI Whisper's fixed front end (whisper_log_mel): 16 kHz, 25 ms windows, 10 ms hop, 30 s per window
WHISPER_SAMPLE_RATE, WHISPER_N_FFT, WHISPER_HOP_LENGTH, WHISPER_WINDOW_SECONDS = 16000, 400, 160, 30




# ----------------------------------------------------------------------------- images

MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE  # 16.8 MP, refused from the header before decoding (_opened)
MORE_PIXELS = f"more than the limit of {MAX_IMAGE_PIXELS:,} pixels"
RESIZE = f"resize it to at most {MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}"


class _PixelBudget:
    """The pixels being decoded at once, bounded: a decode waits until its image's pixels fit. Pillow's memory
    goes with the pixels (about 8 bytes each), so the bound is on memory, and a small image never queues
    behind large ones (a count of decodes made a 64x64 image wait for two 4096x4096 ones)."""

    def __init__(self, pixels: int) -> None:
        self.free = pixels
        self.condition = threading.Condition()

    @contextlib.contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        with self.condition:
            self.condition.wait_for(lambda: self.free >= pixels)
            self.free -= pixels
        try:
            yield
        finally:
            with self.condition:
                self.free += pixels
                self.condition.notify_all()


_decode_budget: Optional[_PixelBudget] = None  # limit_decodes() bounds the pixels decoding in flight


def _decoding(source: Image.Image) -> ContextManager:
    """Hold the opened image's pixels in the decode budget while it decodes (nothing when unbounded)."""
    width, height = source.size
    return contextlib.nullcontext() if _decode_budget is None else _decode_budget.hold(width * height)


def decode_image(data: bytes, pre: PreprocessConfig, name: str = "image") -> np.ndarray:
    """Encoded image bytes (PNG, JPEG, ...) -> normalised float32 (3, S, S), S = pre.image_size.

    Decoded and resized holding its pixels in the decode budget (`limit_decodes`), released only once the
    full-size pixels are freed."""
    source = _opened(data, name)
    with _decoding(source):
        return image_to_array(_rgb(source, name), pre)


def open_image(data: bytes, name: str = "image") -> Image.Image:
    """Encoded image bytes -> a fully decoded PIL RGB image (truncated files fail here, not later).

    The training loader augments this image before `image_to_array`; serving goes through `decode_image`.
    The caller holds the image after its pixels leave the decode budget."""
    source = _opened(data, name)
    with _decoding(source):
        return _rgb(source, name)


def _opened(data: bytes, name: str) -> Image.Image:
    """`data` opened lazily (Pillow reads the header only), refused when it is empty, no image, or larger than
    MAX_IMAGE_PIXELS: before a pixel is decoded, as a 2 KB PNG can claim 20000x20000 (1.6 GB decoded)."""
    from PIL import Image

    if not data:
        raise InputError(f"{name}: empty image data; pass the bytes of a PNG or JPEG file")
    with _mapped_errors(name):
        source = Image.open(io.BytesIO(data))
    width, height = source.size
    if width * height > MAX_IMAGE_PIXELS:
        source.close()
        raise InputError(f"{name}: the image is {width}x{height} pixels, {MORE_PIXELS}; {RESIZE}")
    return source


def _rgb(source: Image.Image, name: str) -> Image.Image:
    """The decoded RGB pixels of an opened image, which is closed (its own pixels freed)."""
    with source, _mapped_errors(name):
        return source.convert("RGB")  # convert() loads the pixels, so decoding errors surface here


@contextlib.contextmanager
def _mapped_errors(name: str) -> Iterator[None]:
    """Pillow's exceptions for undecodable bytes as an InputError naming the image and the fix."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except Image.DecompressionBombError as exc:  # Pillow's own limit, should it be set below ours
        raise InputError(f"{name}: the image holds {MORE_PIXELS} (Pillow: {exc}); {RESIZE}") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{name}: cannot decode the image ({exc}); pass a valid PNG or JPEG file") from exc


def limit_decodes(slots: int) -> None:
    """The images decoding at once in this process hold at most `slots` x MAX_IMAGE_PIXELS pixels, from now on
    (`mindvl serve --decode-slots`: `slots` images of the largest size, or many small ones; the default is no
    bound, as the training loader's threads need). Peak decode memory is then about slots x MAX_IMAGE_PIXELS x
    8 bytes: Pillow holds 4 bytes a pixel, for the decoded image and its RGB copy."""
    global _decode_budget
    if slots < 1:
        raise ValueError(f"decode slots: expected an integer >= 1, got {slots}")
    _decode_budget = _PixelBudget(slots * MAX_IMAGE_PIXELS)


def resize_image(img: Image.Image, size: int) -> Image.Image:
    """Bicubic resize to (size, size) unless the image already is that size (then it is returned as is)."""
    from PIL import Image

    return img if img.size == (size, size) else img.resize((size, size), Image.BICUBIC)


def image_to_array(img: Image.Image, pre: PreprocessConfig) -> np.ndarray:
    """PIL RGB image -> normalised float32 (3, S, S): resize to S = pre.image_size if needed, scale to
    [0, 1], then (x - mean) / std."""
    array = np.asarray(resize_image(img, pre.image_size), dtype=np.float32)  # (S, S, 3)
    mean, std = _mean_std(tuple(pre.image_mean), tuple(pre.image_std))
    array = (array * (1.0 / 255.0) - mean) / std
    return np.ascontiguousarray(array.transpose(2, 0, 1))  # (3, S, S)


@lru_cache(maxsize=8)
def _mean_std(mean: Tuple[float, ...], std: Tuple[float, ...]) -> Tuple[np.ndarray, np.ndarray]:
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


# ----------------------------------------------------------------------------- audio

def load_wav(path_or_bytes: Union[str, Path, bytes], sample_rate: int, name: str = None) -> np.ndarray:
    """Read an audio file (path or bytes: WAV/FLAC/OGG, anything soundfile reads) as float32 mono at
    `sample_rate`, averaging channels and resampling as needed."""
    import librosa
    import soundfile

    is_bytes = isinstance(path_or_bytes, (bytes, bytearray))
    label = name or ("audio" if is_bytes else f"audio {path_or_bytes}")
    if is_bytes and not path_or_bytes:
        raise InputError(f"{label}: empty audio data; pass the bytes of a WAV/FLAC/OGG file")
    source = io.BytesIO(path_or_bytes) if is_bytes else str(path_or_bytes)
    try:
        audio, rate = soundfile.read(source, dtype="float32", always_2d=True)  # (samples, channels)
    except (RuntimeError, OSError, ValueError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise InputError(f"{label}: cannot read the audio ({exc}); pass a WAV/FLAC/OGG file") from exc
    audio = audio.mean(axis=1)
    if rate != sample_rate and audio.size:
        audio = librosa.resample(audio, orig_sr=rate, target_sr=sample_rate)
    return np.ascontiguousarray(audio, dtype=np.float32)


def audio_seconds(frames: int, pre: PreprocessConfig) -> float:
    """How many seconds of audio `frames` log-mel frames cover."""
    return frames * pre.hop_length / pre.sample_rate


@lru_cache(maxsize=8)
def _mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    import librosa

    return librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, htk=False,
                               norm="slaney").astype(np.float32)  # (n_mels, n_fft // 2 + 1)


def log_mel(waveform: np.ndarray, pre: PreprocessConfig, name: str = "audio") -> np.ndarray:
    """Mono float32 waveform at pre.sample_rate -> Whisper-style log-mel float32 (n_mels, len // hop_length)."""
    audio = _checked_waveform(waveform, pre.sample_rate, pre.hop_length, name)
    return _whisper_log_mel(audio, pre.sample_rate, pre.n_fft, pre.hop_length, pre.n_mels)


def whisper_log_mel(waveform: np.ndarray, sample_rate: int = WHISPER_SAMPLE_RATE, n_mels: int = 80,
                    name: str = "audio") -> np.ndarray:
    """What OpenAI Whisper (and WhisperFeatureExtractor) feed its encoder: mono float32 at 16 kHz ->
    float32 (n_mels, 3000), one 30 s window.

    The waveform is trimmed to 30 s or padded with zeros to 480000 samples before the STFT, as Whisper
    does, so the padding is part of the spectrum and of the max - 8 clamp (it is not zero in the mel).
    Give the encoder a frame mask of ones: Whisper attends to the padded frames too.
    """
    if sample_rate != WHISPER_SAMPLE_RATE:
        raise InputError(f"{name}: Whisper's front end takes {WHISPER_SAMPLE_RATE} Hz audio, got {sample_rate} Hz; "
                         f"resample it (load_wav(path, {WHISPER_SAMPLE_RATE}))")
    audio = _checked_waveform(waveform, sample_rate, WHISPER_HOP_LENGTH, name)
    samples = WHISPER_WINDOW_SECONDS * sample_rate
    padded = np.zeros((samples,), np.float32)
    padded[:min(audio.size, samples)] = audio[:samples]
    return _whisper_log_mel(padded, sample_rate, WHISPER_N_FFT, WHISPER_HOP_LENGTH, n_mels)


def _checked_waveform(waveform: np.ndarray, sample_rate: int, hop_length: int, name: str) -> np.ndarray:
    """The waveform as float32 1-D, refusing what no log-mel can represent (InputError naming `name`)."""
    audio = np.asarray(waveform, dtype=np.float32)
    if audio.ndim != 1:
        raise InputError(f"{name}: expected a mono waveform (1-D), got shape {audio.shape}; average the channels")
    if audio.size < hop_length:
        raise InputError(f"{name}: the clip is empty or shorter than one frame ({audio.size} samples at "
                         f"{sample_rate} Hz); record at least {hop_length / sample_rate:.3f} s")
    if not np.all(np.isfinite(audio)):
        raise InputError(f"{name}: the waveform contains NaN or inf; check the decoder that produced it")
    peak = float(np.max(np.abs(audio)))
    if peak < SILENCE_PEAK:
        raise InputError(f"{name}: the clip is silent (peak {peak:.2e} < {SILENCE_PEAK:g}); record speech")
    return audio


def _whisper_log_mel(audio: np.ndarray, sample_rate: int, n_fft: int, hop_length: int, n_mels: int) -> np.ndarray:
    """Whisper's log-mel of a checked float32 waveform: (n_mels, len // hop_length)."""
    import librosa

    stft = librosa.stft(audio, n_fft=n_fft, hop_length=hop_length, window="hann", center=True,
                        pad_mode="reflect")  # (n_fft // 2 + 1, frames + 1)
    power = np.abs(stft[:, :-1]) ** 2  # Whisper drops the last frame
    mel = _mel_filters(sample_rate, n_fft, n_mels) @ power.astype(np.float32)  # (n_mels, frames)
    logmel = np.log10(np.maximum(mel, 1e-10))
    logmel = np.maximum(logmel, logmel.max() - 8.0)
    return ((logmel + 4.0) / 4.0).astype(np.float32)


def pad_mel(mel: np.ndarray, pre: PreprocessConfig, name: str = "audio") -> Tuple[np.ndarray, np.ndarray]:
    """Pad (n_mels, frames) to (n_mels, max_audio_frames) with zeros; returns (mel, frame_mask float32)."""
    n_mels, frames = mel.shape
    limit = pre.max_audio_frames
    if n_mels != pre.n_mels:
        raise InputError(f"{name}: expected {pre.n_mels} mel bands (preprocess.n_mels), got {n_mels}")
    if frames > limit:
        raise InputError(f"{name}: the clip is {audio_seconds(frames, pre):.2f} s ({frames} frames) but at most "
                         f"{audio_seconds(limit, pre):.2f} s fit (preprocess.max_audio_frames={limit}); "
                         f"trim the clip or raise preprocess.max_audio_frames")
    padded = np.zeros((n_mels, limit), np.float32)
    padded[:, :frames] = mel
    mask = np.zeros((limit,), np.float32)
    mask[:frames] = 1.0
    return padded, mask


# ----------------------------------------------------------------------------- text

PAD, UNK, CLS, SEP, BOS, EOS = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, BOS, EOS)  # ids 0..5 in this order


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the conventions mindvl uses for questions, captions and answers."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
        missing = [tok for tok, i in ids.items() if i is None]
        if missing:
            raise InputError(f"tokenizer: missing special tokens {missing}; rebuild it with "
                             f"mindvl.preprocess.build_word_tokenizer or `mindvl data build`")
        self.pad_id, self.unk_id, self.cls_id = ids[PAD], ids[UNK], ids[CLS]
        self.sep_id, self.bos_id, self.eos_id = ids[SEP], ids[BOS], ids[EOS]
        self._special_ids = frozenset(ids.values())

    @classmethod
    def load(cls, path: Union[str, Path]) -> "TextTokenizer":
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise InputError(f"tokenizer {path}: no such file; run `mindvl data build --config ...` first")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
            raise InputError(f"tokenizer {path}: not a valid tokenizer.json ({exc}); rebuild the data set") from exc

    @classmethod
    def pretrained(cls, path: Union[str, Path]) -> "TextTokenizer":
        """A published tokenizer.json (e.g. MiniLM's WordPiece, or a converted text encoder's folder) with
        [BOS] and [EOS] added after its vocabulary when it lacks them (the answer LM needs them; a text
        encoder never sees them, so its embedding table keeps its size). Its own truncation and padding
        are switched off: mindvl pads and checks lengths itself."""
        from tokenizers import Tokenizer

        path = Path(path)
        path = path / "tokenizer.json" if path.is_dir() else path
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a missing or malformed file
            raise InputError(f"tokenizer {path}: not a readable tokenizer.json ({exc}); pass the tokenizer.json of "
                             f"a published model or a `mindvl convert` text folder") from exc
        tokenizer.no_truncation()
        tokenizer.no_padding()
        missing = [tok for tok in (BOS, EOS) if tokenizer.token_to_id(tok) is None]
        if missing:
            tokenizer.add_special_tokens(missing)
        return cls(tokenizer)

    def count(self, text: str) -> int:
        """Tokens of `text` with the two special tokens around it ([CLS]/[SEP] or [BOS]/[EOS])."""
        return len(self._ids(text, "text")) + 2

    def save(self, path: Union[str, Path]) -> None:
        self.tokenizer.save(str(path), pretty=True)

    def to_str(self) -> str:
        return self.tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def tokens(self, text: str) -> List[str]:
        """The word tokens of `text` without special tokens ("What color?" -> ["what", "color", "?"])."""
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def _ids(self, text: str, name: str) -> List[int]:
        if not isinstance(text, str):
            raise InputError(f"{name}: expected a string, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, max_length: int, name: str = "text") -> Tuple[np.ndarray, np.ndarray]:
        """[CLS] words [SEP] padded with [PAD] -> (ids int32 (max_length,), mask float32 (max_length,))."""
        words = self._ids(text, name)
        ids = [self.cls_id, *words, self.sep_id]
        if len(ids) > max_length:
            raise InputError(f"{name}: {text!r} is {len(ids)} tokens with [CLS]/[SEP] but at most {max_length} fit "
                             f"(preprocess.max_text_length); shorten the text or raise the limit")
        out = np.full((max_length,), self.pad_id, np.int32)
        out[:len(ids)] = ids
        mask = np.zeros((max_length,), np.float32)
        mask[:len(ids)] = 1.0
        return out, mask

    def encode_answer(self, text: str, max_length: int, name: str = "answer") -> np.ndarray:
        """[BOS] words [EOS] padded with [PAD] -> int32 (max_length,): the causal LM target."""
        ids = [self.bos_id, *self._ids(text, name), self.eos_id]
        if len(ids) > max_length:
            raise InputError(f"{name}: {text!r} is {len(ids)} tokens with [BOS]/[EOS] but at most {max_length} fit "
                             f"(preprocess.max_answer_length); shorten the answer or raise the limit")
        out = np.full((max_length,), self.pad_id, np.int32)
        out[:len(ids)] = ids
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text, stopping at [EOS] or [PAD] and skipping other special tokens."""
        words = []
        for i in ids:
            i = int(i)
            if i in (self.eos_id, self.pad_id):
                break
            if i in self._special_ids:
                continue
            token = self.tokenizer.id_to_token(i)
            words.append(token if token is not None else UNK)
        return re.sub(r" ([?.,!;:'])", r"\1", " ".join(words))


def build_word_tokenizer(texts: Sequence[str]) -> TextTokenizer:
    """A word-level tokenizer over `texts`: lowercase, split on whitespace and punctuation.

    Trained with `WordLevelTrainer` (every word seen at least once); ids are then fixed in a
    deterministic order: the special tokens 0..5, then the words sorted, so the same texts always give
    the same ids whatever order the trainer's counts come out in.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    def blank() -> Tokenizer:
        return Tokenizer(models.WordLevel({PAD: 0, UNK: 1}, unk_token=UNK))

    trainer_tok = blank()
    _configure(trainer_tok, normalizers, pre_tokenizers)
    trainer = trainers.WordLevelTrainer(vocab_size=1 << 20, min_frequency=1, show_progress=False,
                                        special_tokens=list(SPECIAL_TOKENS))
    trainer_tok.train_from_iterator(list(texts), trainer=trainer)
    words = sorted(set(trainer_tok.get_vocab(with_added_tokens=True)) - set(SPECIAL_TOKENS))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *words])}

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    _configure(tokenizer, normalizers, pre_tokenizers)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    # so that tokenizer.json alone reproduces questions' ids (the serving side may use it directly)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])])
    return TextTokenizer(tokenizer)


def _configure(tokenizer, normalizers, pre_tokenizers) -> None:
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Punctuation()])


def tokenizer_from_json(text: str) -> TextTokenizer:
    """Rebuild a `TextTokenizer` from the JSON string `TextTokenizer.to_str()` wrote."""
    from tokenizers import Tokenizer

    try:
        return TextTokenizer(Tokenizer.from_str(text))
    except Exception as exc:
        raise InputError(f"tokenizer: not a valid tokenizer.json ({exc})") from exc


def preprocess_dict(pre: PreprocessConfig) -> dict:
    """The PreprocessConfig as a plain dict (what meta.json and the model manifest record)."""
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(pre)))


def preprocess_config(recorded: dict) -> PreprocessConfig:
    """The PreprocessConfig a manifest recorded (its other keys, the tokenizer's, left out)."""
    import dataclasses

    return PreprocessConfig(**{f.name: recorded[f.name] for f in dataclasses.fields(PreprocessConfig)})


# ----------------------------------------------------------------------------- a request's graph inputs

def expect(value, kind: type, name: str):
    """`value` if it is a `kind` (str or bytes), else an InputError saying how to send one."""
    if not isinstance(value, kind):
        how = "a JSON string" if kind is str else 'base64 as {"b64": "..."}'
        raise InputError(f"{name}: expected {kind.__name__} ({how}), got {type(value).__name__}")
    return value


class RequestInputs:
    """What one request's fields become as graph inputs (no batch axis), and what the vqa graph's outputs
    become as an answer: the stages the servable that `mindvl deploy` generates runs under MindSpore
    Serving, and the ones `DevicePipeline` runs on the device, written once so the two cannot drift.

    pre: the package's PreprocessConfig (its manifest's "preprocess"). tokenizer: its TextTokenizer, or a
    function returning it (the servable reads the file on first use).
    """

    def __init__(self, pre: PreprocessConfig, tokenizer: Union[TextTokenizer, Callable[[], TextTokenizer]]):
        self.pre = pre
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer if isinstance(self._tokenizer, TextTokenizer) else self._tokenizer()

    def pixels(self, image: bytes, name: str = "image") -> np.ndarray:
        """PNG/JPEG bytes -> float32 (3, image_size, image_size), normalised as in training."""
        return decode_image(expect(image, bytes, name), self.pre, name=name)

    def tokens(self, text: str, name: str) -> Tuple[np.ndarray, np.ndarray]:
        """str -> (token ids int32 (max_text_length,), mask float32 (max_text_length,))."""
        return self.tokenizer.encode(expect(text, str, name), self.pre.max_text_length, name=name)

    def speech(self, audio: bytes, name: str) -> Tuple[np.ndarray, np.ndarray]:
        """WAV/FLAC/OGG bytes -> (log-mel float32 (n_mels, max_audio_frames), frame mask float32 (max_audio_frames,))."""
        waveform = load_wav(expect(audio, bytes, name), self.pre.sample_rate, name=name)
        return pad_mel(log_mel(waveform, self.pre, name=name), self.pre, name=name)

    @staticmethod
    def check_asked(question, audio, prefix: str = "") -> None:
        """A question must come typed (str), spoken (bytes) or both: InputError for a wrong type or neither."""
        expect(question, str, f"{prefix}question")
        expect(audio, bytes, f"{prefix}audio")
        if not question.strip() and len(audio) == 0:
            raise InputError(f"{prefix}predict: question and audio are both empty; ask as text, as audio or both")

    def question_input(self, question: str, name: str = "question") -> Tuple[np.ndarray, np.ndarray, np.float32]:
        """The typed question -> (ids int32 (T,), mask float32 (T,), use_text); zeros and 0 when it is empty."""
        if expect(question, str, name).strip():
            ids, mask = self.tokens(question, name)
            return ids, mask, np.float32(1)
        text = self.pre.max_text_length
        return np.zeros((text,), np.int32), np.zeros((text,), np.float32), np.float32(0)

    def audio_input(self, audio: bytes, name: str = "audio") -> Tuple[np.ndarray, np.ndarray, np.float32]:
        """The spoken question -> (log-mel float32 (n_mels, F), frame mask float32 (F,), use_audio); zeros and
        0 when there is none."""
        if len(expect(audio, bytes, name)) == 0:
            return (np.zeros((self.pre.n_mels, self.pre.max_audio_frames), np.float32),
                    np.zeros((self.pre.max_audio_frames,), np.float32), np.float32(0))
        mel, mask = self.speech(audio, name)
        return mel, mask, np.float32(1)

    def vqa_answer(self, answer_logits: np.ndarray, answer_ids: np.ndarray,
                   labels: Sequence[str]) -> Tuple[str, np.float32, str]:
        """One instance's vqa outputs -> (label, its softmax probability (float32, computed in float64),
        the generated answer text)."""
        logits = np.asarray(answer_logits, np.float64)
        probabilities = np.exp(logits - logits.max())
        best = int(probabilities.argmax())
        return labels[best], np.float32(probabilities[best] / probabilities.sum()), self.tokenizer.decode(answer_ids)
