"""A request's fields as graph inputs, and the vqa graph's outputs as an answer: the stages the generated
servable (MindSpore Serving) and the device pipeline both run, written once so the two cannot drift."""
from __future__ import annotations

from typing import Callable, Sequence, Tuple, Union

import numpy as np

from mindvl.config import PreprocessConfig
from mindvl.errors import InputError
from mindvl.preprocess.audio import speech_features
from mindvl.preprocess.image import decode_image
from mindvl.preprocess.text import TextTokenizer


def expect(value, kind: type, name: str):
    """`value` if it is a `kind` (str or bytes), else an InputError saying how to send one; a str must be valid
    Unicode (JSON can carry a lone surrogate, which no tokenizer takes)."""
    if not isinstance(value, kind):
        how = "a JSON string" if kind is str else 'base64 as {"b64": "..."}'
        raise InputError(f"{name}: expected {kind.__name__} ({how}), got {type(value).__name__}")
    if kind is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(f"{name}: holds a lone surrogate (U+{ord(value[error.start]):04X} at character "
                             f"{error.start}), which is not text; send valid Unicode") from None
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
        return speech_features(expect(audio, bytes, name), self.pre, name=name)

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
