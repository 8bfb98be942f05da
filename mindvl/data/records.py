"""MindRecord tables of a built data set: their schemas, a writer and a reader for the clip table.

A data root holds
  train.mindrecord / test.mindrecord   one row per (image, question): EXAMPLE_SCHEMA
  speech.mindrecord                    one row per spoken question clip: SPEECH_SCHEMA
(each with its `.db` index file next to it). Clips are int16 PCM at the preprocess sample rate.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Union

PAGE_SIZE = 1 << 21
HEADER_SIZE = 1 << 20

EXAMPLE_SCHEMA = {
    "sample_id": {"type": "int64"},  # 0..N-1 in the split's row order: the id resume and sharding speak of
    "image": {"type": "bytes"},  # the PNG as read from disk
    "image_id": {"type": "int32"},
    "question_id": {"type": "int32"},  # index into meta.json "questions"
    "caption_id": {"type": "int32"},  # index into meta.json "captions"
    "answer_id": {"type": "int32"},  # index into meta.json "answers"
}
EXAMPLE_COLUMNS = tuple(EXAMPLE_SCHEMA)

SPEECH_SCHEMA = {
    "question_id": {"type": "int32"},
    "voice": {"type": "string"},
    "rate": {"type": "int32"},  # words per minute
    "split": {"type": "string"},  # "train": a training voice, "test": a voice training never hears
    "pcm": {"type": "bytes"},  # little-endian int16 mono
}


def table_files(root: Union[str, Path], split: str) -> List[str]:
    """The MindRecord file(s) holding `split` in a data root, in row order."""
    return [str(Path(root) / f"{split}.mindrecord")]


def write_table(path: Union[str, Path], schema: Dict, rows: Iterable[Dict], description: str,
                chunk: int = 2048) -> int:
    """Write `rows` (dicts matching `schema`) to one MindRecord file; returns the number written."""
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


def read_table(path: Union[str, Path], columns: List[str] = None) -> List[Dict]:
    """Every row of a (small) MindRecord table, in file order."""
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(path), num_consumer=1, columns=columns)
    try:
        return [dict(row) for row in reader.get_next()]
    finally:
        reader.close()
