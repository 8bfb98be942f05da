"""Cross-modal retrieval Recall@K: test images -> captions, test-voice speech -> question texts.

Retrieval runs over distinct items (each test image once, each test clip once) against the distinct
candidate texts in the data set's meta, so duplicated questions do not inflate the figures.
"""
from typing import Dict, Iterable, List, Sequence

import mindspore as ms
import numpy as np

from mindvl import preprocess
from mindvl.config import Config
from mindvl.data import load_meta, load_tokenizer
from mindvl.data.records import read_split


def recall_at_k(similarity: np.ndarray, targets: np.ndarray, ks: Sequence[int] = (1, 5)) -> Dict[str, float]:
    """similarity: (queries, candidates); targets: (queries,) index of the right candidate."""
    target_scores = similarity[np.arange(len(targets)), targets][:, None]
    rank = (similarity > target_scores).sum(axis=1)  # 0 = the right candidate is first
    return {f"R@{k}": float((rank < k).mean()) for k in ks}


def _embed(net, arrays: List[np.ndarray], batch_size: int) -> np.ndarray:
    outputs = []
    for start in range(0, len(arrays[0]), batch_size):
        outputs.append(net(*[ms.Tensor(a[start:start + batch_size]) for a in arrays]).asnumpy())
    return np.concatenate(outputs)


def embed_texts(text_net, cfg: Config, texts: Iterable[str]) -> np.ndarray:
    tokenizer = load_tokenizer(cfg.data.root)
    encoded = [tokenizer.encode(text, cfg.preprocess.max_text_length) for text in texts]
    ids = np.stack([e[0] for e in encoded])
    mask = np.stack([e[1] for e in encoded])
    return _embed(text_net, [ids, mask], cfg.data.batch_size)


def image_to_caption(cfg: Config, image_net, text_net) -> Dict[str, float]:
    meta = load_meta(cfg.data.root)
    images, caption_ids = {}, {}
    for row in read_split(cfg.data.root, "test", ["image_id", "image", "caption_id"]):
        image_id = int(row["image_id"])
        if image_id not in images:
            images[image_id] = preprocess.decode_image(row["image"], cfg.preprocess, f"test image {image_id}")
            caption_ids[image_id] = int(row["caption_id"])
    order = sorted(images)
    image_emb = _embed(image_net, [np.stack([images[i] for i in order])], cfg.data.batch_size)
    caption_emb = embed_texts(text_net, cfg, meta["captions"])
    result = recall_at_k(image_emb @ caption_emb.T, np.array([caption_ids[i] for i in order]))
    result["queries"] = len(order)
    result["candidates"] = len(meta["captions"])
    return result


def audio_to_text(cfg: Config, audio_net, text_net) -> Dict[str, float]:
    meta = load_meta(cfg.data.root)
    mels, masks, targets = [], [], []
    for row in read_split(cfg.data.root, "speech", ["question_id", "voice", "split", "pcm"]):
        if row["split"] != "test":
            continue
        name = f"test clip (question {row['question_id']}, voice {row['voice']})"
        wave = np.frombuffer(row["pcm"], dtype=np.int16).astype(np.float32) / 32768.0
        mel, mask = preprocess.speech_features(wave, cfg.preprocess, name)
        mels.append(mel)
        masks.append(mask)
        targets.append(int(row["question_id"]))
    audio_emb = _embed(audio_net, [np.stack(mels), np.stack(masks)], cfg.data.batch_size)
    text_emb = embed_texts(text_net, cfg, meta["questions"])
    result = recall_at_k(audio_emb @ text_emb.T, np.array(targets))
    result["queries"] = len(targets)
    result["candidates"] = len(meta["questions"])
    return result
