"""Test-split examples as a client sends them: the image's PNG bytes, the question typed and spoken (WAV bytes in
a test voice) and the expected answer; what quickstart, the serving benchmark and the serving tests query."""
import io
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import List, Union

from mindvl.data.records import SPEECH_TABLE, read_split, read_table
from mindvl.data.root import load_meta


@dataclass(frozen=True)
class QueryExample:
    image: bytes  # PNG as stored
    question: str
    audio: bytes  # WAV, 16-bit mono PCM at the data set's sample rate
    answer: str


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """16-bit mono PCM -> a WAV file's bytes."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def query_examples(root: Union[str, Path], limit: int = 0) -> List[QueryExample]:
    """The first `limit` test examples (0: all) in sample order, each with the first test-voice clip of its question."""
    meta = load_meta(root)
    clips = {}
    for row in read_table(Path(root) / SPEECH_TABLE, ["question_id", "split", "pcm"]):
        if row["split"] == "test":
            clips.setdefault(int(row["question_id"]), bytes(row["pcm"]))
    rows = read_split(root, "test", ["image", "question_id", "answer_id"])
    rate = meta["preprocess"]["sample_rate"]
    return [QueryExample(bytes(row["image"]), meta["questions"][int(row["question_id"])],
                        wav_bytes(clips[int(row["question_id"])], rate), meta["answers"][int(row["answer_id"])])
            for row in rows[:limit or None]]
