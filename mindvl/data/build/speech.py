"""Offline speech synthesis for the spoken questions: espeak-ng driven through ctypes.

`espeakng-loader` ships `libespeak-ng.so` and its `espeak-ng-data` folder inside a wheel, so the data
set builds with no system package and no network. A voice is written as espeak-ng writes it: a
language voice, optionally followed by `+variant` ("en-us", "en-gb-scotland+m3", "en-us+f4"); the
languages come from `espeak_ListVoices`, the variants from `espeak-ng-data/voices/!v`.

espeak-ng keeps global state, so the library is initialised once per process and calls are serialised
with a lock. That state also makes a clip depend on what the process spoke before it (the wave
generator's phase and filters carry over) and on the clock (espeak-ng seeds its random generator, used
by voice variants' breath and flutter, with time() at start-up). `synthesize_fresh` is the reproducible
path the data build uses: every voice is spoken in a new process, in the order given, with the random
generator reseeded before every clip from the clip's (text, voice, rate); the same jobs give the same
samples in any process, on any number of workers.
"""
from __future__ import annotations

import ctypes
import threading
import zlib
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl.errors import MindvlError

# espeak-ng's speak_lib.h constants
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_AUTO = 0
_ESPEAK_RATE = 1
_INITIALIZE_DONT_EXIT = 0x8000
_EE_OK = 0

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class SpeechError(MindvlError, RuntimeError):
    """espeak-ng could not be loaded or could not speak; the message says which voice or text."""


class _Voice(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p), ("identifier", ctypes.c_char_p),
                ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


class _Engine:
    """The process-wide espeak-ng instance (the C library is a singleton)."""

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError as exc:  # pragma: no cover - a hard dependency in setup.py
            raise SpeechError("espeakng-loader is not installed; `pip install espeakng-loader`") from exc
        self.data_path = Path(espeakng_loader.get_data_path())
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        self.can_seed = hasattr(lib, "espeak_ng_SetRandSeed")  # espeak-ng >= 1.52
        if self.can_seed:
            lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, str(self.data_path).encode(),
                                     _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise SpeechError(f"espeak-ng failed to initialise with data at {self.data_path} (code {rate})")
        self.lib = lib
        self.sample_rate = rate  # 22050 for espeak-ng
        self.lock = threading.Lock()
        self._chunks: List[np.ndarray] = []
        # keep a reference: the C library calls this pointer for as long as the process lives
        self._callback = _CALLBACK(self._collect)
        lib.espeak_SetSynthCallback(self._callback)
        self._current_voice: Optional[str] = None
        self.voices = self._list_languages()
        self.variants = sorted(p.name for p in (self.data_path / "voices" / "!v").iterdir() if p.is_file())

    def _collect(self, wav, numsamples, events) -> int:
        if wav and numsamples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        return 0  # 0: continue synthesis

    def _list_languages(self) -> Dict[str, str]:
        """language name ("en-gb") -> voice file identifier ("gmw/en"), for every installed voice."""
        voices = self.lib.espeak_ListVoices(None)
        table: Dict[str, str] = {}
        i = 0
        while voices[i]:
            voice = voices[i].contents
            # `languages` holds (priority byte, name, NUL); only the first entry is reliable in this listing
            language = (voice.languages or b"")[1:].decode("ascii", "replace").lower()
            identifier = (voice.identifier or b"").decode("ascii", "replace")
            if language and identifier:
                table.setdefault(language, identifier)
            i += 1
        return table

    def resolve(self, voice: str) -> str:
        """"en-gb+f3" -> "gmw/en+f3", the spelling `espeak_SetVoiceByName` accepts; unknown names raise."""
        language, _, variant = voice.partition("+")
        identifier = self.voices.get(language.lower())
        if identifier is None:
            close = [v for v in self.voices if v.split("-")[0] == language.split("-")[0].lower()][:12]
            raise SpeechError(f"voice {voice!r}: unknown language voice {language!r}; valid ones include "
                              f"{close or sorted(self.voices)[:20]} (see mindvl.data.build.speech.list_voices())")
        if variant and variant not in self.variants:
            raise SpeechError(f"voice {voice!r}: unknown variant {variant!r}; valid variants include "
                              f"{self.variants[:24]} (see mindvl.data.build.speech.list_variants())")
        return f"{identifier}+{variant}" if variant else identifier

    def synth(self, text: str, voice: str, rate_wpm: int, seed: Optional[int] = None) -> np.ndarray:
        with self.lock:
            if seed is not None and self.can_seed:
                self.lib.espeak_ng_SetRandSeed(int(seed))
            if voice != self._current_voice:
                resolved = self.resolve(voice)
                if self.lib.espeak_SetVoiceByName(resolved.encode()) != _EE_OK:
                    raise SpeechError(f"voice {voice!r} ({resolved}): espeak-ng could not load it")
                self._current_voice = voice
            self.lib.espeak_SetParameter(_ESPEAK_RATE, int(rate_wpm), 0)
            self._chunks = []
            data = text.encode("utf-8") + b"\0"
            buf = ctypes.create_string_buffer(data, len(data))
            err = self.lib.espeak_Synth(buf, len(data), 0, _POS_CHARACTER, 0, _CHARS_AUTO, None, None)
            self.lib.espeak_Synchronize()
            if err != _EE_OK:
                raise SpeechError(f"espeak-ng could not speak {text!r} with voice {voice!r} (code {err})")
            chunks, self._chunks = self._chunks, []
        if not chunks:
            return np.zeros(0, np.int16)
        return np.concatenate(chunks)


_ENGINE: Optional[_Engine] = None
_ENGINE_LOCK = threading.Lock()


def _engine() -> _Engine:
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = _Engine()
        return _ENGINE


def list_voices() -> List[str]:
    """The language voices espeak-ng knows ("en-us", "en-gb-scotland", ...); add "+variant" to any."""
    return sorted(_engine().voices)


def list_variants() -> List[str]:
    """Voice variants ("f3", "m7", "klatt", ...) that may follow a language voice after a '+'."""
    return list(_engine().variants)


def check_voice(voice: str) -> None:
    """Raise `SpeechError` listing valid names unless `voice` ("lang[+variant]") exists."""
    _engine().resolve(voice)


def trim_silence(audio: np.ndarray, threshold: float = 1e-3, margin: int = 160) -> np.ndarray:
    """Drop leading/trailing samples quieter than `threshold` (keeping `margin` samples either side)."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    if loud.size == 0:
        return audio[:0]
    start = max(int(loud[0]) - margin, 0)
    stop = min(int(loud[-1]) + 1 + margin, audio.size)
    return audio[start:stop]


def synthesize(text: str, voice: str = "en-us", rate_wpm: int = 175, sample_rate: int = 16000) -> np.ndarray:
    """Speak `text`; returns float32 mono in [-1, 1] at `sample_rate`, leading/trailing silence trimmed.

    An unknown voice raises `SpeechError` listing valid ones. Empty output (nothing to say) comes back as an
    empty array; the caller decides whether that is an error. Not reproducible sample for sample (see the
    module docstring); `synthesize_fresh` is.
    """
    engine = _engine()
    return _finish(engine.synth(text, voice, rate_wpm), engine.sample_rate, sample_rate)


def _finish(pcm: np.ndarray, native_rate: int, sample_rate: int) -> np.ndarray:
    """espeak-ng's int16 output -> float32 at `sample_rate`, leading/trailing silence trimmed."""
    import librosa

    audio = pcm.astype(np.float32) / 32768.0
    if audio.size and sample_rate != native_rate:
        audio = librosa.resample(audio, orig_sr=native_rate, target_sr=sample_rate).astype(np.float32)
    return trim_silence(np.clip(audio, -1.0, 1.0)).astype(np.float32)


def clip_seed(text: str, voice: str, rate_wpm: int) -> int:
    """The random seed a clip is spoken with: a function of the clip alone."""
    return zlib.crc32(f"{voice}|{int(rate_wpm)}|{text}".encode("utf-8")) & 0x7FFFFFFF


def _speak_voice(voice: str, items: Sequence[Tuple[str, int]]) -> Tuple[int, List[Tuple[Optional[bytes], str]]]:
    """Worker: (native rate, [(int16 bytes or None, error)]) for `items` (text, rate) in one voice."""
    engine = _engine()
    out: List[Tuple[Optional[bytes], str]] = []
    for text, rate in items:
        try:
            out.append((engine.synth(text, voice, rate, seed=clip_seed(text, voice, rate)).tobytes(), ""))
        except SpeechError as exc:
            out.append((None, str(exc)))
    return engine.sample_rate, out


def synthesize_fresh(jobs: Sequence[Tuple[str, str, int]], sample_rate: int = 16000, workers: int = 2,
                     on_voice_done: Optional[Callable[[int], None]] = None) -> List[Tuple[Optional[np.ndarray], str]]:
    """Speak every (text, voice, rate_wpm) job reproducibly: [(float32 clip or None, error)] in job order.

    Each voice runs in a new process (spawned, so no state is inherited), speaking its jobs in the order
    given, each clip reseeded with `clip_seed`; clips come back trimmed and resampled as `synthesize` does.
    `on_voice_done(number of clips)` is called as each voice finishes (a progress bar).
    """
    import multiprocessing

    by_voice: Dict[str, List[int]] = {}
    for i, (_, voice, _) in enumerate(jobs):
        by_voice.setdefault(voice, []).append(i)
    results: List[Tuple[Optional[np.ndarray], str]] = [(None, "not spoken")] * len(jobs)
    if not jobs:
        return results
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, min(workers, len(by_voice))), maxtasksperchild=1) as pool:
        pending = {voice: pool.apply_async(_speak_voice, (voice, [(jobs[i][0], jobs[i][2]) for i in indices]))
                   for voice, indices in by_voice.items()}
        for voice, indices in by_voice.items():
            native_rate, spoken = pending[voice].get()
            for i, (pcm, error) in zip(indices, spoken):
                clip = None if pcm is None else _finish(np.frombuffer(pcm, np.int16), native_rate, sample_rate)
                results[i] = (clip, error)
            if on_voice_done is not None:
                on_voice_done(len(indices))
    return results
