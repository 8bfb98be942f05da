"""Train-only augmentation: random-resized-crop, flip and colour jitter for images, [UNK] masking for
question words, speed, pitch and noise for spoken questions.

Every function is pure: all randomness comes from the `np.random.Generator` passed in, so the loader
can seed one per (seed, epoch, sample) and get the same batches whatever the worker count. Within a
function each step draws from its own child stream (`rng.spawn`), so turning one step off (strength 0)
leaves the others' draws unchanged: an ablation of the flip sees the same crops. A caller that
augments several modalities of one sample should give each its own generator, e.g.
`image_rng, text_rng, audio_rng = np.random.default_rng([seed, epoch, sample_id]).spawn(3)`.

Validation and test data are never augmented; with `cfg.enabled` False `augment_image` is exactly
`preprocess.resize_image` and `augment_waveform` returns the clip unchanged.
"""
from __future__ import annotations

import math
from typing import AbstractSet, Sequence, Tuple

import numpy as np
from PIL import Image, ImageEnhance

from mindvl.config import AugmentConfig
from mindvl.preprocess import SILENCE_PEAK, resize_image

__all__ = ["augment_image", "random_crop_box", "color_jitter", "mask_tokens", "augment_waveform"]

RESAMPLE = "soxr_hq"  # librosa res_type: ~0.5 ms for a 2 s clip at 16 kHz, any (non-integer) ratio
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries this many boxes before a centre crop


# ----------------------------------------------------------------------------- images

def augment_image(img: Image.Image, cfg: AugmentConfig, size: int, rng: np.random.Generator) -> Image.Image:
    """A PIL image -> an augmented RGB (size, size) PIL image, in torchvision's order: random-resized-crop
    (bicubic, like preprocess), horizontal flip with probability `cfg.flip`, colour jitter.

    The result goes through `preprocess.image_to_array` like any other image. Disabled: the plain
    `preprocess.resize_image`, bit-identical to what evaluation and serving see.
    """
    img = img if img.mode == "RGB" else img.convert("RGB")
    if not cfg.enabled:
        return resize_image(img, size)
    crop_rng, flip_rng, jitter_rng = rng.spawn(3)
    left, top, width, height = random_crop_box(img.width, img.height, cfg.crop_scale, cfg.crop_ratio, crop_rng)
    img = img.crop((left, top, left + width, top + height))
    img = resize_image(img, size)
    if flip_rng.random() < cfg.flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return color_jitter(img, cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, jitter_rng)


def random_crop_box(width: int, height: int, scale: Sequence[float], ratio: Sequence[float],
                    rng: np.random.Generator) -> Tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box as (left, top, crop_width, crop_height) in pixels.

    Area fraction uniform in `scale`, aspect ratio (w / h) log-uniform in `ratio`; after 10 boxes that do
    not fit, a centre crop of the whole image clamped to the ratio range. Rounding to whole pixels
    moves the area and ratio slightly outside the ranges on small images (1 px of 64 is 1.6%).
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(_CROP_ATTEMPTS):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def color_jitter(img: Image.Image, brightness: float, contrast: float, saturation: float, hue: float,
                 rng: np.random.Generator) -> Image.Image:
    """torchvision's ColorJitter on an RGB PIL image: the four adjustments in a random order, factors
    uniform in [1 - s, 1 + s], the hue shifted by a fraction uniform in [-hue, hue] of the wheel.

    A strength of 0 skips its step. The draws do not depend on which strengths are 0 (always an order
    and four values), so changing one strength never changes another step's factor. Hue and saturation
    are off in the default config because easy-VQA asks about colours: a jittered "red" may turn orange.
    """
    order = rng.permutation(4)
    strengths = np.array([brightness, contrast, saturation, hue])
    shifts = rng.uniform(-1.0, 1.0, 4) * strengths  # factor - 1 for the first three, hue fraction last
    for step in order:
        if strengths[step] == 0:
            continue
        if step == 0:
            img = ImageEnhance.Brightness(img).enhance(1.0 + shifts[0])  # blend with black
        elif step == 1:
            img = ImageEnhance.Contrast(img).enhance(1.0 + shifts[1])  # blend with the mean grey
        elif step == 2:
            img = ImageEnhance.Color(img).enhance(1.0 + shifts[2])  # blend with the greyscale image
        else:
            img = _shift_hue(img, shifts[3])
    return img


def _shift_hue(img: Image.Image, fraction: float) -> Image.Image:
    """Rotate the hue by `fraction` of the wheel in PIL's 8-bit HSV, as torchvision's PIL backend does."""
    h, s, v = img.convert("HSV").split()
    hue = np.asarray(h, dtype=np.uint8) + np.uint8(np.int64(round(fraction * 255)) % 256)  # wraps mod 256
    return Image.merge("HSV", (Image.fromarray(hue, "L"), s, v)).convert("RGB")


# ----------------------------------------------------------------------------- text

def mask_tokens(ids: np.ndarray, mask: np.ndarray, probability: float, unk_id: int, keep_ids: AbstractSet[int],
                rng: np.random.Generator) -> np.ndarray:
    """Question ids int32 (L,) -> a copy with each word token replaced by `unk_id` with `probability`.

    Only positions with mask > 0 whose id is not in `keep_ids` ([CLS], [SEP], [PAD], ...) can change, so
    the sequence length, the padding and the attention mask stay valid. Draws L uniforms whatever the
    probability, so the caller's later draws from `rng` do not depend on it.
    """
    ids = np.asarray(ids)
    draws = rng.random(ids.shape)
    words = (np.asarray(mask) > 0) & ~np.isin(ids, list(keep_ids))
    return np.where(words & (draws < probability), np.asarray(unk_id, ids.dtype), ids)


# ----------------------------------------------------------------------------- audio

def augment_waveform(audio: np.ndarray, cfg: AugmentConfig, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """Mono float32 waveform -> augmented float32 waveform in [-1, 1], same sample rate.

    Steps, each from its own stream:
    - speed: a factor uniform in `cfg.speed`; the clip is resampled so it plays that much faster (Kaldi's
      speed perturbation: duration / factor, pitch * factor). The length changes: a clip near
      preprocess.max_audio_frames can come out longer than fits, so the caller trims or skips it.
    - pitch: `cfg.pitch` > 0 shifts by semitones uniform in [-pitch, pitch] at constant duration
      (librosa's phase vocoder, ~6 ms per 2 s clip, hence off by default).
    - noise: with probability `cfg.noise`, white noise at an SNR uniform in `cfg.noise_snr_db` relative to
      the clip's RMS; silent clips (peak < preprocess.SILENCE_PEAK) are left silent.
    The result is clipped to [-1, 1] (speed and pitch can overshoot a full-scale clip).
    """
    audio = np.asarray(audio, dtype=np.float32)
    if not cfg.enabled or audio.size == 0:
        return audio
    import librosa

    speed_rng, pitch_rng, noise_rng = rng.spawn(3)
    factor = speed_rng.uniform(cfg.speed[0], cfg.speed[1])
    if factor != 1.0:
        # read as if recorded at sample_rate * factor, resampled to sample_rate: len / factor samples
        audio = librosa.resample(audio, orig_sr=sample_rate * factor, target_sr=sample_rate, res_type=RESAMPLE)
    if cfg.pitch > 0:
        steps = pitch_rng.uniform(-cfg.pitch, cfg.pitch)
        audio = librosa.effects.pitch_shift(audio, sr=sample_rate, n_steps=steps, res_type=RESAMPLE)
    if noise_rng.random() < cfg.noise and np.max(np.abs(audio)) >= SILENCE_PEAK:
        snr_db = noise_rng.uniform(cfg.noise_snr_db[0], cfg.noise_snr_db[1])
        rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
        noise = noise_rng.standard_normal(audio.size, dtype=np.float32)
        audio = audio + noise * np.float32(rms / 10.0 ** (snr_db / 20.0))
    return np.clip(audio, -1.0, 1.0).astype(np.float32)
