import io
import os
from pathlib import Path

import easy_vqa
import numpy as np
import pytest
import soundfile
from PIL import Image

os.environ.setdefault("GLOG_v", "3")

from mindvl import preprocess as P  # noqa: E402
from mindvl.config import PreprocessConfig, load_config  # noqa: E402

PRE = PreprocessConfig()  # Whisper's settings: 16 kHz, n_fft 400, hop 160, 80 mels
TINY = load_config("tiny", ["preprocess.max_audio_frames=200"]).preprocess  # hop 320, 40 mels, 200 frames


@pytest.fixture(scope="module")
def png_bytes():
    return Path(easy_vqa.get_train_image_paths()[0]).read_bytes()


def tone(seconds, freq=440.0, amplitude=0.3, sample_rate=16000):
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ----------------------------------------------------------------------------- images

def test_decode_image_normalises_a_real_easy_vqa_png(png_bytes):
    image = P.decode_image(png_bytes, PRE)
    assert image.dtype == np.float32 and image.shape == (3, 64, 64)
    rgb = np.asarray(Image.open(io.BytesIO(png_bytes)).convert("RGB"), np.float32) / 255.0
    np.testing.assert_allclose(image, (rgb.transpose(2, 0, 1) - 0.5) / 0.5, atol=1e-6)
    assert -1.0 <= image.min() < 0.0 < image.max() <= 1.0  # easy-VQA: white background, a coloured shape


def test_decode_image_resizes_bicubic_and_accepts_other_modes(png_bytes):
    pre = PreprocessConfig(image_size=32, image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0])
    image = P.decode_image(png_bytes, pre)
    expected = Image.open(io.BytesIO(png_bytes)).convert("RGB").resize((32, 32), Image.BICUBIC)
    np.testing.assert_allclose(image, np.asarray(expected, np.float32).transpose(2, 0, 1) / 255.0, atol=1e-6)
    gray = io.BytesIO()
    Image.new("L", (10, 20), 128).save(gray, format="JPEG")
    assert P.decode_image(gray.getvalue(), pre).shape == (3, 32, 32)


@pytest.mark.parametrize("data", [b"", b"definitely not an image", None])
def test_decode_image_rejects_corrupt_bytes_naming_the_item(png_bytes, data):
    data = png_bytes[: len(png_bytes) // 2] if data is None else data  # None: a truncated PNG
    with pytest.raises(P.InputError, match="request 42 image"):
        P.decode_image(data, PRE, name="request 42 image")


def test_the_decode_budget_lets_small_images_past_a_large_one_and_holds_the_rest(png_bytes, monkeypatch):
    """limit_decodes(1): the bytes decoding at once stay within one largest image; a small image decodes
    while most of the budget is held, one that does not fit waits until bytes are released."""
    import threading

    from mindvl.preprocess import budget

    monkeypatch.setattr(budget, "_budget", None)  # restored after the test
    P.limit_decodes(1)
    small = Image.open(io.BytesIO(png_bytes)).size
    small_bytes = small[0] * small[1] * P.image.BYTES_PER_PIXEL
    held = budget.SLOT_BYTES - small_bytes  # what a large decode in flight holds: the small one fits
    done = {}

    def decode(key):
        done[key] = P.decode_image(png_bytes, PRE)

    with budget._budget.hold(held):
        beside = threading.Thread(target=decode, args=("beside",))
        beside.start()
        beside.join(timeout=60)
        assert "beside" in done  # it did not wait for the large decode
        with budget._budget.hold(small_bytes):  # now the budget is full
            waiting = threading.Thread(target=decode, args=("waiting",))
            waiting.start()
            waiting.join(timeout=0.5)
            assert "waiting" not in done  # no room: it waits for bytes to be released
    waiting.join(timeout=60)
    assert np.array_equal(done["waiting"], done["beside"])


def test_a_clip_waits_in_the_same_budget_for_what_its_header_says_it_will_hold(monkeypatch):
    import threading

    from mindvl.preprocess import budget

    monkeypatch.setattr(budget, "_budget", None)
    P.limit_decodes(1)
    clip = wav_bytes(tone(1.0, sample_rate=32000), 32000)
    need = P.audio_header(clip).decode_bytes(PRE.sample_rate)
    assert 32000 * 4 * 3 < need < 2 ** 20  # its samples, their mean, the resampled copy and the spectrum
    done = {}
    with budget._budget.hold(budget.SLOT_BYTES - need + 1):  # one byte short of room for it
        waiting = threading.Thread(target=lambda: done.setdefault("mel", P.speech_features(clip, PRE)))
        waiting.start()
        waiting.join(timeout=0.5)
        assert "mel" not in done
    waiting.join(timeout=60)
    assert done["mel"][1].sum() > 0


# ----------------------------------------------------------------------------- audio

def reference_log_mel(audio, pre):
    """Whisper's recipe written out with numpy's FFT (independent of librosa's STFT)."""
    pad = pre.n_fft // 2
    padded = np.pad(audio.astype(np.float64), pad, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(pre.n_fft) / pre.n_fft)  # periodic hann
    frames = 1 + (padded.size - pre.n_fft) // pre.hop_length
    stack = np.stack([padded[i * pre.hop_length: i * pre.hop_length + pre.n_fft] for i in range(frames)])
    power = np.abs(np.fft.rfft(stack * window, axis=1)).T ** 2  # (n_fft // 2 + 1, frames)
    mel = P.audio._mel_filters(pre.sample_rate, pre.n_fft, pre.n_mels) @ power[:, :-1]
    logmel = np.log10(np.maximum(mel, 1e-10))
    logmel = np.maximum(logmel, logmel.max() - 8.0)
    return (logmel + 4.0) / 4.0


@pytest.mark.parametrize("pre, seconds, frames", [(PRE, 1.0, 100), (PRE, 2.5, 250), (TINY, 1.0, 50)])
def test_log_mel_shape_and_values_match_whisper(pre, seconds, frames):
    rng = np.random.default_rng(0)
    audio = tone(seconds) + 0.01 * rng.standard_normal(int(seconds * 16000)).astype(np.float32)
    mel = P.log_mel(audio, pre)
    assert mel.dtype == np.float32 and mel.shape == (pre.n_mels, frames)
    np.testing.assert_allclose(mel, reference_log_mel(audio, pre), atol=1e-4)
    assert mel.max() - mel.min() <= 2.0 + 1e-6  # the dynamic range is clamped to 8 decades / 4
    # a 440 Hz tone peaks in the mel band that contains 440 Hz
    centres = np.argmax(P.audio._mel_filters(pre.sample_rate, pre.n_fft, pre.n_mels), axis=1) * pre.sample_rate / pre.n_fft
    assert abs(centres[np.argmax(mel.mean(axis=1))] - 440) < 100


def test_mel_filters_are_slaney_scaled_and_normalised():
    import librosa

    filters = P.audio._mel_filters(16000, 400, 80)
    assert filters.shape == (80, 201) and np.all(filters >= 0)
    # slaney mel scale (htk=False), and slaney norm: triangle i peaks at most at 2 / (f[i+2] - f[i]) Hz
    edges = librosa.mel_frequencies(82, fmin=0.0, fmax=8000.0, htk=False)
    peak = 2.0 / (edges[2:] - edges[:-2])
    assert np.all(filters.max(axis=1) <= peak * (1 + 1e-5))
    assert np.all(filters.max(axis=1) >= 0.4 * peak)


@pytest.mark.parametrize("audio, message", [
    (np.zeros(0, np.float32), "empty"),
    (np.zeros(16000, np.float32), "silent"),
    (np.full(16000, 1e-6, np.float32), "silent"),
    (np.array([0.1, np.nan] * 8000, np.float32), "NaN"),
])
def test_log_mel_rejects_unusable_audio_naming_the_item(audio, message):
    with pytest.raises(P.InputError, match=f"clip 7.*{message}"):
        P.log_mel(audio, PRE, name="clip 7")


def test_pad_mel_pads_masks_and_rejects_long_clips():
    mel = P.log_mel(tone(1.0), TINY)  # (40, 50)
    padded, mask = P.pad_mel(mel, TINY)
    assert padded.shape == (40, 200) and mask.shape == (200,) and padded.dtype == mask.dtype == np.float32
    np.testing.assert_array_equal(padded[:, :50], mel)
    assert np.all(padded[:, 50:] == 0) and mask.sum() == 50 and np.all(mask[:50] == 1)
    long = P.log_mel(tone(5.0), TINY)  # 250 frames > 200
    with pytest.raises(P.InputError, match=r"speech\.wav.*5\.00 s.*4\.00 s.*preprocess\.max_audio_frames"):
        P.pad_mel(long, TINY, name="speech.wav")


def test_load_wav_resamples_files_and_bytes(tmp_path):
    path = tmp_path / "tone.wav"
    soundfile.write(str(path), np.stack([tone(1.0, sample_rate=22050)] * 2, axis=1), 22050)  # stereo
    audio = P.load_wav(path, 16000)
    assert audio.dtype == np.float32 and audio.ndim == 1 and abs(audio.size - 16000) <= 1
    assert 0.25 < np.abs(audio).max() < 0.35
    np.testing.assert_allclose(P.load_wav(path.read_bytes(), 16000), audio, atol=1e-6)
    with pytest.raises(P.InputError, match="upload.wav"):
        P.load_wav(b"RIFF garbage", 16000, name="upload.wav")


def wav_bytes(samples, rate, subtype="PCM_16"):
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize("samples, rate, message", [
    (np.zeros(3600, np.int16), 1, "its header declares 1 Hz; send audio sampled at 4000 to 192000 Hz"),
    (np.zeros((400, 6), np.int16), 16000, "its header declares 6 channels; send mono or stereo audio"),
    (np.zeros(16000 * 600, np.int16), 16000, r"the clip is 600\.00 s \(9600000 samples at 16000 Hz, from its header\) "
                                             r"but at most 4\.00 s fit"),
])
def test_a_clip_is_refused_from_its_header_before_a_sample_is_decoded(samples, rate, message, monkeypatch):
    """What the header declares is refused without decoding (the decoder is not reached), naming the clip."""
    clip = wav_bytes(samples, rate)
    monkeypatch.setattr(P.audio, "_decoded", lambda *a: pytest.fail("decoded a clip its header refuses"))
    with pytest.raises(P.InputError, match="upload.wav: " + message):
        P.speech_features(clip, TINY, name="upload.wav")


def test_a_clip_that_fits_is_the_same_checked_from_its_header_as_decoded():
    """The header's length decides as pad_mel does after decoding: 4.00 s fits TINY's 200 frames, a hop more
    does not."""
    fits = wav_bytes(tone(4.0, sample_rate=22050), 22050)
    mel, mask = P.speech_features(fits, TINY)
    np.testing.assert_array_equal(mel, P.pad_mel(P.log_mel(P.load_wav(fits, 16000), TINY), TINY)[0])
    assert mask.sum() == 200
    one_hop_more = np.concatenate([tone(4.0), tone(1.0)[:TINY.hop_length]])
    with pytest.raises(P.InputError, match=f"{4.0 + TINY.hop_length / 16000:.2f} s"):
        P.speech_features(wav_bytes(one_hop_more, 16000), TINY)


def test_undecodable_audio_and_images_name_no_object_address():
    for call in (lambda: P.speech_features(b"RIFF garbage", TINY), lambda: P.decode_image(b"GIF8 junk", PRE)):
        with pytest.raises(P.InputError) as raised:
            call()
        assert " at 0x" not in str(raised.value) and "object" not in str(raised.value), raised.value


# ----------------------------------------------------------------------------- text

TEXTS = ["what color is the shape?", "is there a circle in the image?", "does the image not contain a red shape?",
         "yes", "no", "circle", "red", "a red circle"]


def test_word_tokenizer_splits_punctuation_and_round_trips(tmp_path):
    tok = P.build_word_tokenizer(TEXTS)
    assert tok.tokens("What color is the shape?") == ["what", "color", "is", "the", "shape", "?"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3, 4, 5)
    ids, mask = tok.encode("what color is the shape?", 10)
    assert ids.dtype == np.int32 and mask.dtype == np.float32 and ids.shape == mask.shape == (10,)
    assert ids[0] == tok.cls_id and ids[7] == tok.sep_id and list(ids[8:]) == [0, 0]
    assert list(mask) == [1] * 8 + [0] * 2
    assert tok.decode(ids[1:]) == "what color is the shape?"
    answer = tok.encode_answer("circle", 4)
    assert answer.dtype == np.int32 and answer[0] == tok.bos_id and answer[2] == tok.eos_id and answer[3] == 0
    assert tok.decode(answer) == "circle"
    assert tok.encode("a purple circle", 6)[0][2] == tok.unk_id
    tok.save(tmp_path / "tokenizer.json")
    loaded = P.TextTokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(loaded.encode("is there a circle?", 10)[0], tok.encode("is there a circle?", 10)[0])
    # the file alone reproduces question ids ([CLS] ... [SEP]) for consumers that use `tokenizers` directly
    assert loaded.tokenizer.encode("is there a circle?").ids == list(tok.encode("is there a circle?", 7)[0])


def test_word_tokenizer_ids_do_not_depend_on_text_order():
    a = P.build_word_tokenizer(TEXTS)
    b = P.build_word_tokenizer(list(reversed(TEXTS)) * 3)
    assert a.to_str() == b.to_str()


def test_too_long_text_names_the_text_and_the_limit():
    tok = P.build_word_tokenizer(TEXTS)
    with pytest.raises(P.InputError, match=r"question 3: 'does the image.*preprocess\.max_text_length"):
        tok.encode("does the image not contain a red shape?", 8, name="question 3")
    with pytest.raises(P.InputError, match=r"preprocess\.max_answer_length"):
        tok.encode_answer("a red circle", 4)


def test_loading_a_missing_or_broken_tokenizer_says_what_to_do(tmp_path):
    with pytest.raises(P.InputError, match="mindvl data build"):
        P.TextTokenizer.load(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(P.InputError, match="not a valid tokenizer.json"):
        P.TextTokenizer.load(tmp_path / "broken.json")


# ----------------------------------------------------------------------------- a request's graph inputs

def test_request_inputs_turn_a_typed_or_spoken_question_into_the_graph_rows(png_bytes):
    """The stages the servable and the device pipeline share: shapes, dtypes, flags and zeros for what is
    not asked, and the answer from the vqa outputs."""
    tokenizer = P.build_word_tokenizer(TEXTS)
    calls = []
    inputs = P.RequestInputs(TINY, lambda: calls.append(1) or tokenizer)  # the servable's lazy tokenizer
    assert inputs.pixels(png_bytes).shape == (3, TINY.image_size, TINY.image_size)
    ids, mask, use_text = inputs.question_input("what color is the shape?")
    assert ids.dtype == np.int32 and mask.dtype == np.float32 and use_text == 1 and mask.sum() == 8
    ids, mask, use_text = inputs.question_input("  ")
    assert use_text == 0 and not ids.any() and not mask.any() and ids.shape == (TINY.max_text_length,)
    buffer = io.BytesIO()
    soundfile.write(buffer, tone(1.0, sample_rate=TINY.sample_rate), TINY.sample_rate, format="WAV")
    mel, frames, use_audio = inputs.audio_input(buffer.getvalue())
    assert mel.shape == (TINY.n_mels, TINY.max_audio_frames) and use_audio == 1 and 0 < frames.sum() < frames.size
    mel, frames, use_audio = inputs.audio_input(b"")
    assert use_audio == 0 and not mel.any() and not frames.any()
    logits = np.array([0.0, 2.0, 1.0], np.float32)
    answer, confidence, text = inputs.vqa_answer(logits, tokenizer.encode_answer("circle", 4), ["a", "b", "c"])
    assert answer == "b" and text == "circle" and confidence.dtype == np.float32
    assert abs(float(confidence) - np.exp(2) / np.exp([0.0, 2.0, 1.0]).sum()) < 1e-7
    assert calls  # the tokenizer function was asked, not captured at construction


@pytest.mark.parametrize("question, audio, message", [
    ("", b"", "item 2: predict: question and audio are both empty"),
    (3, b"", "item 2: question: expected str"),
    ("what?", "a.wav", "item 2: audio: expected bytes"),
])
def test_request_inputs_refuse_a_question_that_is_not_asked_or_not_typed_right(question, audio, message):
    with pytest.raises(P.InputError, match=message):
        P.RequestInputs.check_asked(question, audio, "item 2: ")
