"""Audio: a file or bytes -> a mono waveform -> Whisper's log-mel -> the padded features a model takes.

`speech_features` is the one way a clip becomes a model's audio input (training, serving, the device,
generation): load at pre.sample_rate, Whisper's log-mel (librosa STFT, hann, centred with reflect padding,
power spectrum without the last frame, slaney mel filters, log10 clamped to max - 8, then (x + 4) / 4), padded
to preprocess.max_audio_frames with its frame mask.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Tuple, Union

import numpy as np

from mindvl.config import PreprocessConfig
from mindvl.errors import InputError, plain
from mindvl.preprocess.budget import decoding

SILENCE_PEAK = 1e-4  # a clip whose peak |amplitude| is below this is treated as silent
# OpenAI Whisper's fixed front end (whisper_log_mel): 16 kHz, 25 ms windows, 10 ms hop, 30 s per window
WHISPER_SAMPLE_RATE, WHISPER_N_FFT, WHISPER_HOP_LENGTH, WHISPER_WINDOW_SECONDS = 16000, 400, 160, 30


# What a clip's header may declare (checked before a sample is decoded): a 3.6 KB WAV declaring 1 Hz for an hour
# was resampled to 57.6 M samples (+800 MB) before its length refused it
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 192000
MAX_CHANNELS = 2  # speech is mono or stereo; each channel is decoded before they are averaged


@dataclass(frozen=True)
class AudioHeader:
    """What a clip's header says: its sample rate, channels, length in samples (per channel) and encoding."""

    rate: int
    channels: int
    frames: int
    subtype: str

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def resampled(self, sample_rate: int) -> int:
        """Its length in samples at `sample_rate` (as librosa.resample makes it)."""
        return self.frames if self.rate == sample_rate else int(np.ceil(self.frames * sample_rate / self.rate))

    def decode_bytes(self, sample_rate: int) -> int:
        """About what decoding it at `sample_rate` holds at its peak (measured within it): soundfile's float32
        samples of every channel, their mean, the resampled copy, and the log-mel's short-time spectrum
        (complex64, 201 bins every 160 samples: 10 bytes a sample)."""
        return 4 * self.frames * (self.channels + 2) + 24 * self.resampled(sample_rate)


def audio_header(path_or_bytes: Union[str, Path, bytes], label: str = "audio") -> AudioHeader:
    """A clip's header (WAV/FLAC/OGG, anything soundfile reads), refused (InputError naming `label`) when it
    cannot be read or declares a rate outside [MIN_SAMPLE_RATE, MAX_SAMPLE_RATE] or more than MAX_CHANNELS
    channels, before a sample is decoded."""
    import soundfile

    if isinstance(path_or_bytes, (bytes, bytearray)) and not path_or_bytes:
        raise InputError(f"{label}: empty audio data; pass the bytes of a WAV/FLAC/OGG file")
    try:
        info = soundfile.info(_source(path_or_bytes))
    except (RuntimeError, OSError, ValueError, TypeError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise InputError(f"{label}: cannot read the audio ({plain(str(exc))}); pass a WAV/FLAC/OGG file") from exc
    header = AudioHeader(int(info.samplerate), int(info.channels), int(info.frames), str(info.subtype))
    if not MIN_SAMPLE_RATE <= header.rate <= MAX_SAMPLE_RATE:
        raise InputError(f"{label}: its header declares {header.rate} Hz; send audio sampled at {MIN_SAMPLE_RATE} to "
                         f"{MAX_SAMPLE_RATE} Hz (16000 is what speech models hear)")
    if not 1 <= header.channels <= MAX_CHANNELS:
        raise InputError(f"{label}: its header declares {header.channels} channels; send mono or stereo audio")
    return header


def _source(path_or_bytes):
    return io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else str(path_or_bytes)


def load_wav(path_or_bytes: Union[str, Path, bytes], sample_rate: int, name: str = None) -> np.ndarray:
    """Read an audio file (path or bytes: WAV/FLAC/OGG, anything soundfile reads) as float32 mono at
    `sample_rate`, averaging channels and resampling as needed; its header is checked first (audio_header)."""
    is_bytes = isinstance(path_or_bytes, (bytes, bytearray))
    label = name or ("audio" if is_bytes else f"audio {path_or_bytes}")
    return _decoded(path_or_bytes, audio_header(path_or_bytes, label), sample_rate, label)


def _decoded(path_or_bytes, header: AudioHeader, sample_rate: int, label: str) -> np.ndarray:
    import librosa
    import soundfile

    try:
        audio, rate = soundfile.read(_source(path_or_bytes), dtype="float32", always_2d=True)  # (samples, channels)
    except (RuntimeError, OSError, ValueError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise InputError(f"{label}: cannot read the audio ({plain(str(exc))}); pass a WAV/FLAC/OGG file") from exc
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


def speech_features(audio: Union[str, Path, bytes, np.ndarray], pre: PreprocessConfig,
                    name: str = "audio") -> Tuple[np.ndarray, np.ndarray]:
    """A clip as the model's audio input: (log-mel float32 (n_mels, max_audio_frames), frame mask float32
    (max_audio_frames,)). `audio`: a file's path or bytes (WAV/FLAC/OGG, loaded mono at pre.sample_rate), or
    a float32 waveform already at pre.sample_rate. InputError names `name` when it cannot be used. A file's
    header is read first: a clip longer than max_audio_frames is refused before a sample is decoded, and the
    decode holds its bytes in the decode budget (budget.py)."""
    if isinstance(audio, np.ndarray):
        return pad_mel(log_mel(audio, pre, name=name), pre, name=name)
    header = audio_header(audio, name)
    frames, limit = header.resampled(pre.sample_rate) // pre.hop_length, pre.max_audio_frames
    if frames > limit:
        raise InputError(f"{name}: the clip is {header.seconds:.2f} s ({header.frames} samples at {header.rate} Hz, "
                         f"from its header) but at most {audio_seconds(limit, pre):.2f} s fit "
                         f"(preprocess.max_audio_frames={limit}); trim the clip or raise preprocess.max_audio_frames")
    with decoding(header.decode_bytes(pre.sample_rate)):
        return pad_mel(log_mel(_decoded(audio, header, pre.sample_rate, name), pre, name=name), pre, name=name)
