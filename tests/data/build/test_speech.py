import itertools

import numpy as np
import pytest

from mindvl import preprocess as P
from mindvl.config import DataConfig, PreprocessConfig
from mindvl.data import records
from mindvl.data.build import speech

QUESTION = "what color is the shape?"


def test_the_default_voices_exist_and_sound_different():
    data = DataConfig()
    voices = [*data.train_voices, *data.test_voices]
    assert len(data.train_voices) >= 4 and len(data.test_voices) >= 2
    pre = PreprocessConfig()
    mels = {}
    for voice in voices:
        speech.check_voice(voice)
        audio = speech.synthesize(QUESTION, voice, 175, pre.sample_rate)
        mels[voice] = P.log_mel(audio, pre, name=voice).mean(axis=1)  # average spectrum (n_mels,)
    for a, b in itertools.combinations(voices, 2):
        # each pair of voices differs clearly in average spectral shape (not just in length)
        assert np.abs(mels[a] - mels[b]).mean() > 0.02, (a, b)


def test_synthesis_is_trimmed_16khz_float_and_faster_speech_is_shorter():
    slow = speech.synthesize(QUESTION, "en-us", 130, 16000)
    fast = speech.synthesize(QUESTION, "en-us", 260, 16000)
    assert slow.dtype == np.float32 and slow.ndim == 1
    assert 0.05 < np.abs(slow).max() <= 1.0
    assert 0.8 < slow.size / 16000 < 3.0  # a short sentence, silence trimmed
    assert np.abs(slow[:20]).max() < np.abs(slow).max() * 0.5  # starts near the onset, not mid-word
    assert fast.size < 0.75 * slow.size
    # espeak-ng is not bit-exact from call to call (a few samples of state carry over), only close;
    # the build synthesises each clip once and stores it, so a built data set is fixed
    assert abs(speech.synthesize(QUESTION, "en-us", 130, 16000).size - slow.size) < 0.01 * slow.size


def test_pcm16_round_trip():
    audio = speech.synthesize("is there a circle?", "en-gb", 175, 16000)
    back = records.from_pcm16(records.to_pcm16(audio))
    assert np.abs(back - audio).max() < 1e-4


@pytest.mark.parametrize("voice, fragment", [("en-xx", "unknown language voice"), ("en-us+nosuch", "unknown variant")])
def test_an_unknown_voice_lists_valid_ones(voice, fragment):
    with pytest.raises(speech.SpeechError, match=fragment) as info:
        speech.synthesize("hello", voice)
    assert "en-us" in str(info.value) or "f3" in str(info.value)
    assert "en-gb-scotland" in speech.list_voices() and "m3" in speech.list_variants()
