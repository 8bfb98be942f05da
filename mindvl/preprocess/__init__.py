"""The one place where bytes become arrays: images, audio and text.

The data loader, the server and the device path all call these functions with the `PreprocessConfig`
that the model package's manifest records, so what the model sees in training is exactly what it sees
when deployed. Every function raises `InputError` (a `ValueError`) naming the offending item and what to
do about it, never a bare library exception.

    image.py     image: RGB, bicubic resize to (image_size, image_size), [0, 1], then (x - mean) / std;
                 float32 (3, S, S); pixel limits
    budget.py    the memory images and clips decoding at once may hold (a server's --decode-slots)
    audio.py     audio: mono float32 at `sample_rate`; Whisper's log-mel, float32 (n_mels, frames) with
                 frames = len(waveform) // hop_length; `speech_features`: a clip as the model's input;
                 a clip's header checked (rate, channels, length) before it is decoded
    text.py      a word-level `tokenizers` tokenizer; questions are [CLS] words [SEP], answers
                 [BOS] words [EOS], both padded with [PAD] = 0
    request.py   a request (image bytes, a typed and/or spoken question) as the vqa graph's inputs
                 (`RequestInputs`), the stages both the generated servable and the device pipeline run
    recorded.py  the settings as a manifest records them

The C++ device runner mirrors these conventions and a test compares the two.
"""
from mindvl.errors import InputError
from mindvl.preprocess.audio import (MAX_CHANNELS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, SILENCE_PEAK, WHISPER_HOP_LENGTH,
                                     WHISPER_N_FFT, WHISPER_SAMPLE_RATE, audio_header, audio_seconds, load_wav, log_mel,
                                     pad_mel, speech_features, whisper_log_mel)
from mindvl.preprocess.budget import limit_decodes
from mindvl.preprocess.image import (MAX_ASPECT_RATIO, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, decode_image, image_to_array,
                                     open_image, resize_image)
from mindvl.preprocess.recorded import preprocess_config, preprocess_dict
from mindvl.preprocess.request import RequestInputs, expect
from mindvl.preprocess.text import (BOS, CLS, EOS, PAD, SEP, SPECIAL_TOKENS, UNK, TextTokenizer, build_word_tokenizer,
                                    tokenizer_from_json)

__all__ = ["InputError", "RequestInputs", "expect", "decode_image", "open_image", "limit_decodes", "resize_image",
           "image_to_array", "MAX_IMAGE_SIDE", "MAX_IMAGE_PIXELS", "MAX_ASPECT_RATIO", "load_wav", "audio_header",
           "MIN_SAMPLE_RATE", "MAX_SAMPLE_RATE", "MAX_CHANNELS", "audio_seconds", "log_mel",
           "whisper_log_mel", "pad_mel", "speech_features", "SILENCE_PEAK", "WHISPER_SAMPLE_RATE", "WHISPER_N_FFT", "WHISPER_HOP_LENGTH", "TextTokenizer",
           "build_word_tokenizer", "tokenizer_from_json", "SPECIAL_TOKENS", "PAD", "UNK", "CLS", "SEP", "BOS", "EOS",
           "preprocess_dict", "preprocess_config"]
