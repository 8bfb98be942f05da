from pathlib import Path

import easy_vqa
import numpy as np
import pytest
from PIL import Image, ImageOps

from mindvl import preprocess as P
from mindvl.config import AugmentConfig, PreprocessConfig
from mindvl.data.reading import augment as A
from mindvl.data.build import easyvqa, speech

SR = 16000
# every step off: what remains is the crop/resize path
OFF = dict(crop_scale=[1.0, 1.0], crop_ratio=[1.0, 1.0], flip=0.0, brightness=0.0, contrast=0.0, saturation=0.0,
           hue=0.0, token_mask=0.0, speed=[1.0, 1.0], pitch=0.0, noise=0.0)


def aug(**changes):
    cfg = AugmentConfig(**{**OFF, **changes})
    cfg.validate()
    return cfg


def rng(seed):
    return np.random.default_rng([seed, 7])  # the loader seeds with (seed, epoch, sample) lists like this


def pixels(img):
    return np.asarray(img, np.int16)


@pytest.fixture(scope="module")
def png_bytes():
    return Path(easy_vqa.get_train_image_paths()[3]).read_bytes()


@pytest.fixture(scope="module")
def photo(png_bytes):
    return P.open_image(png_bytes, "easy-VQA train image 3")


@pytest.fixture(scope="module")
def clip():
    """A real spoken question, 16 kHz mono float32 (espeak-ng is not bit-exact across calls: synthesise once)."""
    return speech.synthesize("what color is the shape?", "en-us", 175, SR)


def tone(freq, seconds=1.0, amplitude=0.3):
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_frequency(audio):
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    return np.argmax(spectrum) * SR / audio.size


def rms(x):
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


# ----------------------------------------------------------------------------- images

def test_image_augmentation_repeats_for_a_seed_and_differs_across_seeds(photo):
    cfg = AugmentConfig(saturation=0.2, hue=0.05)  # the defaults plus every jitter step
    first = pixels(A.augment_image(photo, cfg, 64, rng(1)))
    assert np.array_equal(first, pixels(A.augment_image(photo, cfg, 64, rng(1))))
    others = [pixels(A.augment_image(photo, cfg, 64, rng(seed))) for seed in range(2, 7)]
    assert all(not np.array_equal(first, other) for other in others)


@pytest.mark.parametrize("size", [64, 32])
def test_augmented_image_is_rgb_at_the_model_size_and_normalises_into_range(photo, size):
    pre = PreprocessConfig(image_size=size)
    cfg = AugmentConfig(crop_scale=[0.3, 1.0], brightness=0.5, contrast=0.5, saturation=0.5, hue=0.5)
    for seed in range(5):
        out = A.augment_image(photo.convert("P"), cfg, size, rng(seed))  # any mode comes back RGB
        assert out.mode == "RGB" and out.size == (size, size)
        array = P.image_to_array(out, pre)
        assert array.dtype == np.float32 and array.shape == (3, size, size)
        assert np.isfinite(array).all() and -1.0 <= array.min() and array.max() <= 1.0


@pytest.mark.parametrize("size", [64, 32])
def test_disabled_augmentation_is_exactly_the_preprocess_path(png_bytes, size):
    pre = PreprocessConfig(image_size=size)
    plain = P.decode_image(png_bytes, pre)
    image = P.open_image(png_bytes)
    for cfg in (AugmentConfig(enabled=False), aug()):  # disabled, or enabled with every step off
        out = A.augment_image(image, cfg, size, rng(0))
        assert np.array_equal(P.image_to_array(out, pre), plain)


def test_flip_with_probability_one_mirrors_what_flip_zero_gives(photo):
    # each step draws from its own stream, so the same seed gives the same crop and jitter either way
    base = dict(crop_scale=[0.5, 0.9], crop_ratio=[0.8, 1.25], brightness=0.3, contrast=0.3)
    for seed in range(4):
        kept = A.augment_image(photo, aug(flip=0.0, **base), 48, rng(seed))
        flipped = A.augment_image(photo, aug(flip=1.0, **base), 48, rng(seed))
        assert np.array_equal(pixels(flipped), pixels(ImageOps.mirror(kept)))
    assert np.array_equal(pixels(A.augment_image(photo, aug(flip=1.0), 64, rng(0))), pixels(ImageOps.mirror(photo)))


def test_flip_probability_is_respected_over_many_draws(photo):
    cfg = aug(flip=0.5)
    mirrored = pixels(ImageOps.mirror(photo))
    flips = sum(np.array_equal(pixels(A.augment_image(photo, cfg, 64, rng(s))), mirrored) for s in range(200))
    assert 70 <= flips <= 130  # Binomial(200, 0.5): mean 100, sd ~7


@pytest.mark.parametrize("width, height", [(64, 64), (300, 120)])
def test_crop_box_lies_inside_the_image_with_area_and_aspect_in_range(width, height):
    scale, ratio = (0.3, 0.8), (0.75, 4 / 3)
    generator = rng(0)
    for _ in range(500):
        left, top, w, h = A.random_crop_box(width, height, scale, ratio, generator)
        assert 0 <= left and left + w <= width and 0 <= top and top + h <= height
        # whole-pixel rounding moves each side by at most half a pixel
        assert scale[0] * width * height - (w + h) <= w * h <= scale[1] * width * height + (w + h)
        assert (w - 0.5) / (h + 0.5) <= ratio[1] and (w + 0.5) / (h - 0.5) >= ratio[0]


def test_crop_box_falls_back_to_a_centre_crop_when_no_box_fits():
    # a square image cannot hold a 2:1 to 3:1 box with the full area: torchvision's centre crop at ratio 2
    assert A.random_crop_box(64, 64, (1.0, 1.0), (2.0, 3.0), rng(0)) == (0, 16, 64, 32)
    assert A.random_crop_box(64, 64, (1.0, 1.0), (0.25, 0.5), rng(0)) == (16, 0, 32, 64)


def test_the_image_shows_exactly_the_drawn_crop_box():
    # a coordinate image: red = x, green = y, so the output's corners tell where the crop was taken
    y, x = np.mgrid[0:256, 0:256]
    ramp = Image.fromarray(np.stack([x, y, np.zeros_like(x)], axis=-1).astype(np.uint8), "RGB")
    cfg = aug(crop_scale=[0.2, 0.6], crop_ratio=[0.75, 4 / 3])
    size = 128
    for seed in range(4):
        out = pixels(A.augment_image(ramp, cfg, size, rng(seed))).astype(np.float64)
        crop_rng = rng(seed).spawn(3)[0]  # the crop's stream, as augment_image derives it
        left, top, w, h = A.random_crop_box(256, 256, cfg.crop_scale, cfg.crop_ratio, crop_rng)
        # output pixel k samples source x = left + (k + 0.5) * w / size - 0.5 (bicubic, clamped at the edges)
        assert abs(out[size // 2, 0, 0] - (left + 0.5 * w / size - 0.5)) <= 1.5
        assert abs(out[size // 2, -1, 0] - (left + w - 0.5 * w / size - 0.5)) <= 1.5
        assert abs(out[0, size // 2, 1] - (top + 0.5 * h / size - 0.5)) <= 1.5
        assert abs(out[-1, size // 2, 1] - (top + h - 0.5 * h / size - 0.5)) <= 1.5
        seen_w = (out[size // 2, -1, 0] - out[size // 2, 0, 0]) * size / (size - 1)
        seen_h = (out[-1, size // 2, 1] - out[0, size // 2, 1]) * size / (size - 1)
        assert 0.2 - 0.03 <= seen_w * seen_h / 256 ** 2 <= 0.6 + 0.03


def test_brightness_jitter_scales_pixels_within_its_strength(photo):
    base = pixels(photo).astype(np.float64).mean()
    ratios = [pixels(A.augment_image(photo, aug(brightness=0.2), 64, rng(s))).mean() / base for s in range(20)]
    assert all(0.8 - 0.01 <= r <= 1.2 + 0.01 for r in ratios)
    assert max(ratios) - min(ratios) > 0.1  # the factor really varies


def test_hue_jitter_rotates_the_hue_by_at_most_its_strength():
    red = Image.new("RGB", (8, 8), (200, 0, 0))  # PIL HSV hue 0
    shifts = []
    for seed in range(20):
        hsv = np.asarray(A.augment_image(red, aug(hue=0.1), 8, rng(seed)).convert("HSV"), np.int16)
        shift = (int(hsv[0, 0, 0]) + 128) % 256 - 128  # signed, in 1/256 of the wheel
        shifts.append(shift)
        assert abs(shift) <= 0.1 * 255 + 2 and hsv[0, 0, 2] >= 195  # value (brightness) kept
    assert min(shifts) < -5 and max(shifts) > 5


# ----------------------------------------------------------------------------- text

@pytest.fixture(scope="module")
def question_batch():
    """Real easy-VQA questions encoded as the loader does: (ids int32 (n, L), mask float32 (n, L), tokenizer)."""
    questions = easyvqa.load_split("train", limit=30).questions
    tokenizer = P.build_word_tokenizer(questions)
    encoded = [tokenizer.encode(q, 16) for q in questions]
    return np.stack([e[0] for e in encoded]), np.stack([e[1] for e in encoded]), tokenizer


def special_ids(tok):
    return frozenset({tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.bos_id, tok.eos_id})


def test_mask_tokens_never_touches_special_tokens_or_padding(question_batch):
    ids, mask, tok = question_batch
    keep = special_ids(tok)
    words = (mask > 0) & ~np.isin(ids, list(keep))
    for row_ids, row_mask, row_words in zip(ids, mask, words):
        before = row_ids.copy()
        out = A.mask_tokens(row_ids, row_mask, 1.0, tok.unk_id, keep, rng(0))
        assert out.dtype == np.int32 and out.shape == row_ids.shape
        assert np.array_equal(row_ids, before)  # the input is not modified
        assert np.array_equal(out[~row_words], row_ids[~row_words])  # [CLS], [SEP], [PAD] as they were
        assert (out[row_words] == tok.unk_id).all()
        assert np.array_equal(A.mask_tokens(row_ids, row_mask, 0.0, tok.unk_id, keep, rng(0)), row_ids)
    # positions outside the mask stay put even if they hold a word id
    row = np.array([tok.cls_id, 9, 10, tok.sep_id, 11, 12], np.int32)
    out = A.mask_tokens(row, np.array([1, 1, 1, 1, 0, 0], np.float32), 1.0, tok.unk_id, keep, rng(0))
    assert out.tolist() == [tok.cls_id, tok.unk_id, tok.unk_id, tok.sep_id, 11, 12]


def test_mask_tokens_masks_about_p_of_the_words_and_repeats_per_seed(question_batch):
    ids, mask, tok = question_batch
    keep = special_ids(tok)
    words = (mask > 0) & ~np.isin(ids, list(keep))
    generator = rng(3)
    masked = total = 0
    for _ in range(40):
        for row_ids, row_mask, row_words in zip(ids, mask, words):
            out = A.mask_tokens(row_ids, row_mask, 0.3, tok.unk_id, keep, generator)
            masked += int((out[row_words] == tok.unk_id).sum())
            total += int(row_words.sum())
    assert total > 5000 and abs(masked / total - 0.3) < 0.02
    first = A.mask_tokens(ids[0], mask[0], 0.5, tok.unk_id, keep, rng(5))
    assert np.array_equal(first, A.mask_tokens(ids[0], mask[0], 0.5, tok.unk_id, keep, rng(5)))


# ----------------------------------------------------------------------------- audio

def test_waveform_augmentation_repeats_for_a_seed_and_differs_across_seeds(clip):
    cfg = AugmentConfig(pitch=1.0, noise=0.5)
    first = A.augment_waveform(clip, cfg, SR, rng(1))
    assert np.array_equal(first, A.augment_waveform(clip, cfg, SR, rng(1)))
    for seed in range(2, 5):
        other = A.augment_waveform(clip, cfg, SR, rng(seed))
        assert other.size != first.size or not np.array_equal(other, first)


def test_speed_1_1_shortens_the_clip_and_raises_its_pitch_by_1_1(clip):
    faster = A.augment_waveform(clip, aug(speed=[1.1, 1.1]), SR, rng(0))
    slower = A.augment_waveform(clip, aug(speed=[0.9, 0.9]), SR, rng(0))
    assert faster.dtype == np.float32 and abs(faster.size - clip.size / 1.1) <= 2
    assert abs(slower.size - clip.size / 0.9) <= 2
    assert peak_frequency(A.augment_waveform(tone(440.0), aug(speed=[1.1, 1.1]), SR, rng(0))) == \
        pytest.approx(484.0, abs=2.0)


def test_pitch_shift_keeps_the_length_and_moves_the_pitch_within_its_range(clip):
    low, high = 440.0 * 2 ** (-2 / 12), 440.0 * 2 ** (2 / 12)
    freqs = []
    for seed in range(3):
        shifted = A.augment_waveform(tone(440.0), aug(pitch=2.0), SR, rng(seed))
        assert shifted.size == SR
        freqs.append(peak_frequency(shifted))
        assert low - 3 <= freqs[-1] <= high + 3
    assert max(freqs) - min(freqs) > 5
    assert A.augment_waveform(clip, aug(pitch=2.0), SR, rng(0)).size == clip.size


def test_noise_is_added_at_the_drawn_snr_and_silence_stays_silent(clip):
    noisy = A.augment_waveform(clip, aug(noise=1.0, noise_snr_db=[20.0, 20.0]), SR, rng(0))
    assert noisy.shape == clip.shape
    snr = 20 * np.log10(rms(clip) / rms(noisy - clip))
    assert snr == pytest.approx(20.0, abs=0.3)
    assert np.array_equal(A.augment_waveform(clip, aug(noise=0.0), SR, rng(0)), clip)
    silence = np.zeros(SR, np.float32)
    assert np.array_equal(A.augment_waveform(silence, aug(noise=1.0), SR, rng(0)), silence)


def test_waveform_stays_finite_float32_within_full_scale(clip):
    loud = clip / np.abs(clip).max()  # peaks at exactly 1.0: resampling and noise overshoot it
    cfg = AugmentConfig(speed=[0.9, 1.1], pitch=2.0, noise=1.0, noise_snr_db=[0.0, 10.0])
    for seed in range(3):
        out = A.augment_waveform(loud, cfg, SR, rng(seed))
        assert out.dtype == np.float32 and out.ndim == 1
        assert np.isfinite(out).all() and np.abs(out).max() <= 1.0
        P.log_mel(out, PreprocessConfig())  # the loader's next step accepts it


def test_disabled_waveform_augmentation_returns_the_clip(clip):
    assert np.array_equal(A.augment_waveform(clip, AugmentConfig(enabled=False), SR, rng(0)), clip)
    assert np.array_equal(A.augment_waveform(clip, aug(), SR, rng(0)), clip)
