"""MindRecord tables of a built data set: their schemas, file names, a writer and readers.

A data root holds
  train / test examples   one row per (image, question): EXAMPLE_SCHEMA, in data.shards files per split:
                          `train.mindrecord` when shards is 1, else `train-00000-of-00004.mindrecord`, ...
                          each shard a contiguous range of sample_id (0..N-1 over the split)
  speech.mindrecord       one row per spoken question clip: SPEECH_SCHEMA
  conversations-<split>   one row per conversation for the generative model: CONVERSATION_SCHEMA, sharded
                          like the examples (`conversations-train.mindrecord`, ...)
(each with its `.db` index file next to it). Clips are int16 PCM at the preprocess sample rate.
meta.json "tables" lists every split's files in row order; `table_files` reads it.

Each shard is a complete MindRecord set of its own (shard_num=1), so it can be written, verified and
skipped independently; `MindDataset(table_files(root, split))` reads them as one data set. A file's
header and its .db record the file's base name, so a shard must be written under its final name.
Given the same rows, the writer produces byte-identical files (no timestamps or absolute paths inside).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Union

import numpy as np

SPLITS = ("train", "test")  # the example tables a data root holds (a source hands over these)
PAGE_SIZE = 1 << 21
HEADER_SIZE = 1 << 20

EXAMPLE_SCHEMA = {
    "sample_id": {"type": "int64"},  # 0..N-1 in the split's row order: the id resume and sharding speak of
    "image": {"type": "bytes"},  # the encoded image as read from disk (PNG, JPEG, ...)
    "image_id": {"type": "int32"},
    "question_id": {"type": "int32"},  # index into meta.json "questions"
    "caption_id": {"type": "int32"},  # index into meta.json "captions"
    "answer_id": {"type": "int32"},  # index into meta.json "answers"
}
EXAMPLE_COLUMNS = tuple(EXAMPLE_SCHEMA)

SPEECH_SCHEMA = {
    "question_id": {"type": "int32"},
    "voice": {"type": "string"},  # an espeak-ng voice, or "user" for a recording that came with the data
    "rate": {"type": "int32"},  # words per minute (measured for user recordings)
    "split": {"type": "string"},  # "train": a training voice, "test": a voice training never hears
    "pcm": {"type": "bytes"},  # little-endian int16 mono
}
SPEECH_TABLE = "speech.mindrecord"

CONVERSATION_SCHEMA = {
    "sample_id": {"type": "int64"},  # 0..N-1 in the table's row order
    "conversation": {"type": "string"},  # its id: "train-12-vqa", or the id its JSONL line gave
    "kind": {"type": "string"},  # "vqa", "spoken", "caption", "multi" (derived) or "user" (a JSONL line)
    "turns": {"type": "string"},  # JSON, the LLaVA convention: [{"from": "user", "value": "<image> ..."}, ...]
    "image": {"type": "bytes"},  # the encoded image; empty: none; several: pack_images' container
    "image_id": {"type": "int32"},  # the example tables' image id (validation hold-out); -1: none
    "other_image_id": {"type": "int32"},  # a derived "pair"'s other image (held out with it); -1: none
    "question_id": {"type": "int32"},  # a spoken question: one of its clips in speech.mindrecord; else -1
    "pcm": {"type": "bytes"},  # the conversation's own recording, int16 at the sample rate; empty: none
}
CONVERSATION_COLUMNS = tuple(CONVERSATION_SCHEMA)


def conversation_table(split: str) -> str:
    """The name meta.json "tables" lists the conversations of example split `split` under."""
    return f"conversations-{split}"


def shard_names(split: str, shards: int) -> List[str]:
    """File names of a split's example shards, in row order."""
    if shards == 1:
        return [f"{split}.mindrecord"]
    return [f"{split}-{i:05d}-of-{shards:05d}.mindrecord" for i in range(shards)]


def shard_ranges(rows: int, shards: int) -> List[range]:
    """Split row indices 0..rows-1 into `shards` contiguous ranges whose sizes differ by at most one."""
    base, extra = divmod(rows, shards)
    ranges, start = [], 0
    for i in range(shards):
        stop = start + base + (1 if i < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


def table_files(root: Union[str, Path], split: str) -> List[str]:
    """The MindRecord file(s) holding `split` ("train", "test", "speech" or a conversation_table) in a data
    root, in row order.

    Read from meta.json "tables" when the root has one; otherwise the single-file name (which may not
    exist: the caller reports a missing root).
    """
    root = Path(root)
    if split == "speech":
        return [str(root / SPEECH_TABLE)]
    try:
        tables = json.loads((root / "meta.json").read_text())["tables"]
        return [str(root / name) for name in tables[split]]
    except (OSError, ValueError, KeyError, TypeError):
        return [str(root / f"{split}.mindrecord")]


def write_table(path: Union[str, Path], schema: Dict, rows: Iterable[Dict], description: str,
                chunk: int = 2048) -> int:
    """Write `rows` (dicts matching `schema`) to one MindRecord file; returns the number written.

    An empty `rows` still writes a valid, empty table.
    """
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    # MindRecord's default 32 MB pages make even a tiny table 50 MB; rows here are at most ~100 KB
    writer.set_page_size(PAGE_SIZE)
    writer.set_header_size(HEADER_SIZE)
    writer.add_schema(schema, description)
    count, batch = 0, []
    for row in rows:
        batch.append(row)
        if len(batch) >= chunk:
            writer.write_raw_data(batch)
            count += len(batch)
            batch = []
    if batch:
        writer.write_raw_data(batch)
        count += len(batch)
    writer.commit()
    return count


IMAGES_MAGIC = b"MINDVL-IMAGES\x00"  # several images in one bytes field: magic, count, each length (u64 LE), data


def pack_images(images) -> bytes:
    """A conversation's encoded images as one bytes field: the image itself when it is one (tables built before
    several read the same), none as empty, several in a container `images_of` opens."""
    images = [bytes(image) for image in images]
    if len(images) <= 1:
        return images[0] if images else b""
    lengths = np.asarray([len(image) for image in images], "<u8")
    return IMAGES_MAGIC + np.asarray([len(images)], "<u8").tobytes() + lengths.tobytes() + b"".join(images)


def images_of(value) -> List[bytes]:
    """The encoded images a conversation's bytes field holds (pack_images' inverse); [] for none."""
    data = as_bytes(value)
    if not data.startswith(IMAGES_MAGIC):
        return [data] if data else []
    start = len(IMAGES_MAGIC)
    count = int(np.frombuffer(data[start:start + 8], "<u8")[0])
    lengths = np.frombuffer(data[start + 8:start + 8 + 8 * count], "<u8").astype(int)
    offsets = start + 8 + 8 * count + np.concatenate([[0], np.cumsum(lengths)])
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def as_bytes(value) -> bytes:
    """A MindRecord bytes field (numpy array or bytes) as bytes. MindDataset hands an empty field as a single
    NUL byte (dtype S1), which no image or clip can be: it reads as empty."""
    if not hasattr(value, "tobytes"):
        return bytes(value)
    data = value.tobytes()
    return b"" if data == b"\x00" and getattr(value, "dtype", None) is not None and value.dtype.kind == "S" else data


def read_table(path: Union[str, Path], columns: List[str] = None) -> List[Dict]:
    """Every row of a (small) MindRecord table, in file order."""
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(path), num_consumer=1, columns=columns)
    try:
        return [dict(row) for row in reader.get_next()]
    finally:
        reader.close()


def read_split(root: Union[str, Path], split: str, columns: List[str] = None) -> List[Dict]:
    """Every row of a split over all its shards, in sample_id order (small tables: evaluation, tests)."""
    rows: List[Dict] = []
    for path in table_files(root, split):
        rows.extend(read_table(path, columns))
    return rows


def to_pcm16(audio: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian int16 bytes (how clips are stored in speech.mindrecord)."""
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2").tobytes()


def from_pcm16(data: bytes) -> np.ndarray:
    """Inverse of `to_pcm16`: int16 bytes -> float32 (int16 / 32768, the usual convention)."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
