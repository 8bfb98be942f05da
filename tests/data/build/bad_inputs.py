"""Real inputs for the cleaning tests: easy-VQA images and questions, espeak-ng speech, and broken copies of them.

`make_user_folder` writes a data folder in the layout of mindvl/data/build/userdata.py from a few real easy-VQA
images and injects one of every problem the build must quarantine; `EXPECTED` says which reason each
injected item must get.
"""
import io
import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import easy_vqa
import numpy as np
import soundfile
from PIL import Image

from mindvl.data.build import speech

SR = 16000
LONG_QUESTION = "what is the color of the big shape that you can see right in the middle of this picture?"
CYRILLIC_QUESTION = "какого цвета фигура?"
EMOJI_QUESTION = "what color is the shape 🙂?"


@lru_cache(maxsize=2)
def _paths(split: str):
    return easy_vqa.get_train_image_paths() if split == "train" else easy_vqa.get_test_image_paths()


@lru_cache(maxsize=2)
def _pairs(split: str):
    get = easy_vqa.get_train_questions if split == "train" else easy_vqa.get_test_questions
    pairs = defaultdict(list)
    for q, a, i in zip(*get()):
        pairs[int(i)].append((q, a))
    return pairs


def easy_path(split: str, image_id: int) -> Path:
    return Path(_paths(split)[image_id])


def easy_pairs(split: str, image_id: int):
    """The (question, answer) pairs easy-VQA asks about one image, in its order."""
    return list(_pairs(split)[image_id])


def spoken(text: str = "what color is the shape?", rate: int = SR, voice: str = "en-us") -> np.ndarray:
    return speech.synthesize(text, voice, 175, rate)


def write_wav(path: Path, audio: np.ndarray, rate: int = SR, subtype: str = "PCM_16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), audio, rate, subtype=subtype)
    return path


def jpeg_bytes(src: Path, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.open(src).convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def resaved_png_bytes(src: Path) -> bytes:
    """The same pixels, encoded again (other compression settings, so other bytes)."""
    buf = io.BytesIO()
    Image.open(src).convert("RGB").save(buf, "PNG", compress_level=0)
    data = buf.getvalue()
    assert data != src.read_bytes()
    return data


def blank_png_bytes(colour=(240, 236, 230), size: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return buf.getvalue()


# injected item (file name or line marker) -> the reason the build must give it
EXPECTED = {
    "images/copy_of_train_2.png": "image_duplicate",  # byte-identical copy
    "images/resaved_train_3.png": "image_duplicate",  # re-encoded PNG, identical pixels
    "images/jpeg_train_4.jpg": "image_near_duplicate",  # JPEG q95 copy
    "images/blank.png": "image_low_information",
    "images/truncated.png": "bad_image",
    "images/truncated.jpg": "bad_image",
    "images/garbage.png": "bad_image",
    "images/missing.png": "image_missing",
    "audio/empty.wav": "audio_empty",
    "audio/silent.wav": "audio_silent",
    "audio/clipped.wav": "audio_clipped",
    "audio/nan.wav": "audio_nonfinite",
    "audio/garbage.wav": "bad_audio",
    "audio/missing.wav": "audio_missing",
}


# audio file -> (question, answer) of the line of train image 0 that names it
SPOKEN = {"good.wav": ("what is the color of the shape?", "blue"), "rate8k.wav": ("is there a blue shape?", "yes"),
          "empty.wav": ("is there a red shape?", "no"), "silent.wav": ("is there a green shape?", "no"),
          "clipped.wav": ("is there a circle?", "no"), "nan.wav": ("is there a gray shape?", "no"),
          "garbage.wav": ("is there a teal shape?", "no"), "missing.wav": ("is there a brown shape?", "no")}


def _chat(*texts):
    return [{"from": "human" if i % 2 == 0 else "gpt", "value": text} for i, text in enumerate(texts)]


# conversation lines of train.jsonl -> the reason the build quarantines them (None: kept)
CONVERSATIONS = [
    {"image": "images/train_0.png", "audio": "audio/good.wav", "conversations": _chat("<image>\n<audio>", "blue")},
    {"conversations": _chat("say hello", "hello", "again", "hello again")},
    {"image": "images/garbage.png", "conversations": _chat("<image>\nwhat is it?", "noise")},
    {"image": "images/train_1.png", "audio": "audio/garbage.wav", "conversations": _chat("<image>\n<audio>", "no")},
    {"image": "images/train_1.png", "conversations": _chat("no placeholder here", "x")},
    {"image": "../outside.png", "conversations": _chat("<image>\nq", "x")},
    {"id": "c-twice", "conversations": _chat("hi", "one")},
    {"id": "c-twice", "conversations": _chat("hi", "two")},
]
CONVERSATION_REASONS = [None, None, "bad_image", "bad_audio", "bad_conversation", "bad_conversation", None,
                        "bad_conversation"]


def make_user_folder(folder: Path) -> Path:
    """Train: easy-VQA train images 0-5 with their questions plus the injected items; test: test images
    0-2 and an exact copy of train image 5 (a leak the build must remove from train)."""
    images, audio = folder / "images", folder / "audio"
    images.mkdir(parents=True)
    audio.mkdir()
    train, test = [], []

    def add(lines, image, question, answer, **extra):
        lines.append(json.dumps({"image": image, "question": question, "answer": answer, **extra},
                                ensure_ascii=False))

    for i in range(6):
        (images / f"train_{i}.png").write_bytes(easy_path("train", i).read_bytes())
        for q, a in easy_pairs("train", i):
            add(train, f"images/train_{i}.png", q, a)
    # a caption given on one line labels that line; the image's other lines take it too
    train[0] = json.dumps({**json.loads(train[0]), "caption": "A  Blue RECTANGLE"})

    # duplicates: the copy repeats one question of its original (a duplicate row) and asks one it lacks
    (images / "copy_of_train_2.png").write_bytes(easy_path("train", 2).read_bytes())
    q2, a2 = easy_pairs("train", 2)[0]
    add(train, "images/copy_of_train_2.png", q2, a2)
    asked = {q for q, _ in easy_pairs("train", 2)}
    add(train, "images/copy_of_train_2.png", next(q for q in ("is there a triangle?", "is there a red shape?",
                                                                "does the image not contain a circle?")
                                                    if q not in asked), "yes", caption="a red triangle")
    (images / "resaved_train_3.png").write_bytes(resaved_png_bytes(easy_path("train", 3)))
    for q, a in easy_pairs("train", 3)[:2]:
        add(train, "images/resaved_train_3.png", q, a)
    (images / "jpeg_train_4.jpg").write_bytes(jpeg_bytes(easy_path("train", 4)))
    for q, a in easy_pairs("train", 4)[:3]:
        add(train, "images/jpeg_train_4.jpg", q, a)

    # images that cannot be used
    (images / "blank.png").write_bytes(blank_png_bytes())
    png5 = easy_path("train", 5).read_bytes()
    (images / "truncated.png").write_bytes(png5[: len(png5) * 2 // 3])
    jpeg5 = jpeg_bytes(easy_path("train", 5))
    (images / "truncated.jpg").write_bytes(jpeg5[: len(jpeg5) // 2])
    (images / "garbage.png").write_bytes(np.random.default_rng(0).bytes(3000))
    for name in ("blank.png", "truncated.png", "truncated.jpg", "garbage.png", "missing.png"):
        add(train, f"images/{name}", "what color is the shape?", "blue", caption="a blue circle")

    # texts that cannot be used (or can, mapped to [UNK])
    add(train, "images/train_0.png", LONG_QUESTION, "blue")
    add(train, "images/train_1.png", CYRILLIC_QUESTION, "blue")
    add(train, "images/train_1.png", EMOJI_QUESTION, "blue")

    # recordings of questions image 0 (a blue rectangle) is not asked anywhere else
    good = spoken(SPOKEN["good.wav"][0])
    write_wav(audio / "good.wav", good)
    write_wav(audio / "rate8k.wav", spoken(SPOKEN["rate8k.wav"][0], rate=8000), rate=8000)
    write_wav(audio / "empty.wav", np.zeros(0, np.float32))
    write_wav(audio / "silent.wav", np.zeros(SR, np.float32))
    write_wav(audio / "clipped.wav", np.clip(good * 20.0, -1.0, 1.0))
    nan = good.copy()
    nan[100:200] = np.nan
    write_wav(audio / "nan.wav", nan, subtype="FLOAT")
    (audio / "garbage.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + np.random.default_rng(1).bytes(500))
    for name, (question, answer) in SPOKEN.items():
        add(train, "images/train_0.png", question, answer, audio=f"audio/{name}")

    # malformed lines
    train.insert(3, '{"image": "images/train_0.png", "question": ')
    train.insert(5, json.dumps({"image": "images/train_0.png", "question": "what shape is this?"}))

    # conversation lines for the generative model (appended: the lines above keep their numbers)
    for number, line in enumerate(CONVERSATIONS, start=len(train) + 1):
        train.append(json.dumps({"id": f"c{number}", **line} if "id" not in line else line))

    for i in range(3):
        (images / f"test_{i}.png").write_bytes(easy_path("test", i).read_bytes())
        for q, a in easy_pairs("test", i):
            add(test, f"images/test_{i}.png", q, a)
    (images / "test_copy_of_train_5.png").write_bytes(png5)
    for q, a in easy_pairs("train", 5):
        add(test, "images/test_copy_of_train_5.png", q, a)
    test.insert(1, "")
    test.insert(2, "[1, 2]")
    (folder / "train.jsonl").write_text("\n".join(train) + "\n", encoding="utf-8")
    (folder / "test.jsonl").write_text("\n".join(test) + "\n", encoding="utf-8")
    return folder
