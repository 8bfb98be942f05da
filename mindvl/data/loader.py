"""`create_dataset`: a built data root -> batched `mindspore.dataset` pipeline of model inputs.

Each row of `<root>/<split>.mindrecord` (image, question, caption, answer ids) becomes one example:
the image decoded by `preprocess.decode_image`, the question and caption tokenised, a spoken version of
the question as a padded log-mel, the answer as a class id and as LM tokens, and two flags that say
which question modality the model sees. Everything goes through `mindvl.preprocess`, the same code the
server and the device use.

Audio: training picks one of the question's training-voice clips at random per sample and per epoch
(voice and speed augmentation); the test split picks a test-voice clip deterministically, so evaluation
hears only speakers training never heard and gives the same result every run. Mels are computed once
per clip and cached (the clip table is small: ~1k clips, loaded once per process).

Randomness (clip choice, modality mix) is a hash of (data.seed, rank, image_id, question_id, visit
number, where the visit number is the epoch), so it does not depend on which worker handles a row:
a run is reproducible given data.seed.
"""
from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.config import Config, PreprocessConfig

COLUMNS = ("image", "question_ids", "question_mask", "audio_mel", "audio_mask", "use_text", "use_audio",
           "caption_ids", "caption_mask", "answer", "answer_tokens", "question_group", "caption_group")
MODALITIES = ("mix", "text", "audio", "both")
_FLAGS = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))  # (use_text, use_audio) for [text, audio, both]


class DataRootError(FileNotFoundError):
    """The data root is missing or incomplete; the message says how to build it."""


def _require(root: Path, name: str) -> Path:
    path = root / name
    if not path.is_file():
        raise DataRootError(f"data root {root}: {name} is missing; build the data set first with "
                            f"`mindvl data build --config <recipe>` (it writes to data.root)")
    return path


def load_meta(root: Union[str, Path]) -> Dict:
    """meta.json of a built data root: answers, questions, captions, voices, preprocess, counts."""
    return json.loads(_require(Path(root), "meta.json").read_text())


def load_tokenizer(root: Union[str, Path]) -> P.TextTokenizer:
    """The data set's word tokenizer (`<root>/tokenizer.json`)."""
    return P.TextTokenizer.load(_require(Path(root), "tokenizer.json"))


def _mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 rounds): cheap per-sample randomness independent of workers."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h


def _uniform(*values: int) -> float:
    return (_mix(*values) >> 11) / float(1 << 53)


class ExampleTransform:
    """Row of ids + image bytes -> the 13 model input columns (one example, unbatched).

    Picklable: it carries only paths and settings; each process loads the tokenizer, meta and clip
    table on its first call.
    """

    def __init__(self, root: Union[str, Path], pre: PreprocessConfig, split: str, modality: str,
                 modality_mix: List[float], seed: int, rank_id: int = 0) -> None:
        self.root = str(root)
        self.pre = pre
        self.split = split
        self.train = split == "train"
        self.modality = modality
        self.cumulative_mix = np.cumsum(np.asarray(modality_mix, np.float64)).tolist()
        self.seed = int(seed)
        self.rank_id = int(rank_id)
        self._state = None
        self._lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_state"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lazily loaded, per process
    def _load(self) -> "_State":
        state = self._state
        if state is None or state.pid != os.getpid():
            with self._lock:  # batch worker threads share one state; load it once
                if self._state is None or self._state.pid != os.getpid():
                    self._state = _State(Path(self.root), self.pre, self.split)
                state = self._state
        return state

    def __call__(self, image, image_id, question_id, caption_id, answer_id):
        state = self._load()
        image_id, question_id = int(image_id), int(question_id)
        caption_id, answer_id = int(caption_id), int(answer_id)
        visit = state.next_visit(image_id, question_id) if self.train else 0

        pixels = P.decode_image(_as_bytes(image), self.pre, name=f"{self.split} image {image_id}")
        question_ids, question_mask = state.question(question_id)
        caption_ids, caption_mask = state.caption(caption_id)
        clips = state.clips.get(question_id)
        if not clips:
            raise P.InputError(f"{self.split} question {question_id}: no spoken clip in speech.mindrecord; "
                               f"rebuild the data set with `mindvl data build --force`")
        if self.train:
            clip = clips[_mix(self.seed, self.rank_id, image_id, question_id, visit, 1) % len(clips)]
        else:
            clip = clips[(image_id + question_id) % len(clips)]
        mel, mel_mask = state.mel(clip)
        use_text, use_audio = self._flags(image_id, question_id, visit)
        return (pixels, question_ids, question_mask, mel, mel_mask, np.float32(use_text), np.float32(use_audio),
                caption_ids, caption_mask, np.int32(answer_id), state.answer_tokens(answer_id),
                np.int32(question_id), np.int32(caption_id))

    def _flags(self, image_id: int, question_id: int, visit: int) -> Tuple[float, float]:
        if self.modality == "text":
            return _FLAGS[0]
        if self.modality == "audio":
            return _FLAGS[1]
        if self.modality == "both":
            return _FLAGS[2]
        u = _uniform(self.seed, self.rank_id, image_id, question_id, visit, 2)
        for flags, edge in zip(_FLAGS, self.cumulative_mix):
            if u < edge:
                return flags
        return _FLAGS[-1]


class _State:
    """Per-process caches: tokenised questions/captions/answers, the clip table and its mels."""

    def __init__(self, root: Path, pre: PreprocessConfig, split: str) -> None:
        from mindvl.data import records, speech

        self.pid = os.getpid()
        self.pre = pre
        meta = load_meta(root)
        self.tokenizer = load_tokenizer(root)
        self.questions: List[str] = meta["questions"]
        self.captions: List[str] = meta["captions"]
        self.answers: List[str] = meta["answers"]
        self.clips: Dict[int, List[int]] = defaultdict(list)  # question_id -> clip indices
        self.pcm: List[bytes] = []
        self.names: List[str] = []
        rows = records.read_table(_require(root, "speech.mindrecord"))
        rows.sort(key=lambda r: (r["question_id"], r["voice"], r["rate"]))  # independent of file order
        for row in rows:
            if row["split"] != split:
                continue
            self.clips[int(row["question_id"])].append(len(self.pcm))
            self.pcm.append(row["pcm"])
            self.names.append(f"clip of question {row['question_id']} ({row['voice']} at {row['rate']} wpm)")
        self._from_pcm16 = speech.from_pcm16
        self._mels: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._questions: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._captions: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._answers: Dict[int, np.ndarray] = {}
        self._visits: Dict[Tuple[int, int], int] = defaultdict(int)

    def next_visit(self, image_id: int, question_id: int) -> int:
        key = (image_id, question_id)
        visit = self._visits[key]
        self._visits[key] = visit + 1
        return visit

    def question(self, qid: int) -> Tuple[np.ndarray, np.ndarray]:
        if qid not in self._questions:
            self._questions[qid] = self.tokenizer.encode(self.questions[qid], self.pre.max_text_length,
                                                         name=f"question {qid}")
        return self._questions[qid]

    def caption(self, cid: int) -> Tuple[np.ndarray, np.ndarray]:
        if cid not in self._captions:
            self._captions[cid] = self.tokenizer.encode(self.captions[cid], self.pre.max_text_length,
                                                        name=f"caption {cid}")
        return self._captions[cid]

    def answer_tokens(self, aid: int) -> np.ndarray:
        if aid not in self._answers:
            self._answers[aid] = self.tokenizer.encode_answer(self.answers[aid], self.pre.max_answer_length,
                                                              name=f"answer {aid}")
        return self._answers[aid]

    def mel(self, clip: int) -> Tuple[np.ndarray, np.ndarray]:
        if clip not in self._mels:
            name = self.names[clip]
            mel = P.log_mel(self._from_pcm16(self.pcm[clip]), self.pre, name=name)
            self._mels[clip] = P.pad_mel(mel, self.pre, name=name)
        return self._mels[clip]


def _check_compatible(root: Path, meta: Dict, pre: PreprocessConfig) -> None:
    """The tables hold raw bytes, so most preprocess settings may change after a build, but not these."""
    built = meta.get("preprocess", {})
    problems = []
    if built.get("sample_rate", pre.sample_rate) != pre.sample_rate:
        problems.append(f"clips are at {built['sample_rate']} Hz but preprocess.sample_rate={pre.sample_rate}")
    for key in ("max_text_length", "max_audio_frames"):
        if built.get(key, 0) > getattr(pre, key):
            problems.append(f"preprocess.{key}={getattr(pre, key)} is below the {built[key]} the data was built with")
    if problems:
        raise DataRootError(f"data root {root}: " + "; ".join(problems) +
                            "; rebuild with `mindvl data build --config <recipe> --force`")


def _as_bytes(value) -> bytes:
    if isinstance(value, np.ndarray):
        return value.tobytes()
    return bytes(value)


def create_dataset(cfg: Config, split: str, *, shuffle: Optional[bool] = None, question_modality: str = "mix",
                   batch_size: Optional[int] = None, drop_remainder: Optional[bool] = None, rank_id: int = 0,
                   rank_size: int = 1):
    """Batched pipeline over `<cfg.data.root>/<split>.mindrecord` with the columns in `COLUMNS`.

    Shapes (B = batch, S = image_size, Lt = max_text_length, Ta = max_audio_frames, La = max_answer_length):
      image f32 (B,3,S,S); question_ids i32 (B,Lt); question_mask f32 (B,Lt); audio_mel f32 (B,n_mels,Ta);
      audio_mask f32 (B,Ta); use_text f32 (B,); use_audio f32 (B,); caption_ids i32 (B,Lt);
      caption_mask f32 (B,Lt); answer i32 (B,); answer_tokens i32 (B,La); question_group i32 (B,)
      (= question id); caption_group i32 (B,) (= caption id).
    `question_modality`: "mix" samples [text, audio, both] with data.question_modality_mix; "text",
    "audio", "both" fix the flags. Defaults: shuffle and drop_remainder for "train", neither for "test".
    With rank_size > 1 each rank reads its shard of the rows: with drop_remainder (training) MindSpore's
    equal-sized shards, otherwise an exact partition (rank r reads rows r, r + rank_size, ...).
    """
    import mindspore.dataset as ds

    from mindvl.data import records

    if split not in ("train", "test"):
        raise ValueError(f"split {split!r}: expected 'train' or 'test'")
    if question_modality not in MODALITIES:
        raise ValueError(f"question_modality {question_modality!r}: expected one of {list(MODALITIES)}")
    if rank_size < 1 or not 0 <= rank_id < rank_size:
        raise ValueError(f"rank_id={rank_id}, rank_size={rank_size}: expected 0 <= rank_id < rank_size")
    root = Path(cfg.data.root)
    if not root.is_dir():
        raise DataRootError(f"data root {root} does not exist; build it first with "
                            f"`mindvl data build --config <recipe>` (or set data.root)")
    table = _require(root, f"{split}.mindrecord")
    train = split == "train"
    shuffle = train if shuffle is None else bool(shuffle)
    drop_remainder = train if drop_remainder is None else bool(drop_remainder)
    batch_size = int(batch_size or cfg.data.batch_size)
    ds.config.set_seed(cfg.data.seed)

    meta = load_meta(root)
    _check_compatible(root, meta, cfg.preprocess)
    if rank_size == 1:
        reading = {"shuffle": shuffle}
    elif drop_remainder:
        # training: MindSpore's shards have equal sizes (repeating up to rank_size - 1 rows), so every rank
        # runs the same number of steps and collectives never wait on a rank that ran out of data
        reading = {"shuffle": shuffle, "num_shards": rank_size, "shard_id": rank_id}
    else:
        # evaluation: an exact partition, so every example is counted once over all ranks
        mine = list(range(rank_id, int(meta["counts"][split]["examples"]), rank_size))
        reading = {"sampler": ds.SubsetRandomSampler(mine) if shuffle else ds.SubsetSampler(mine)}
    data = ds.MindDataset(str(table), columns_list=list(records.EXAMPLE_COLUMNS), **reading)
    transform = ExampleTransform(root, cfg.preprocess, split, question_modality, cfg.data.question_modality_mix,
                                 cfg.data.seed, rank_id)
    # Transform whole batches: a per-row map costs MindSpore ~200 us of conversions per row, more than
    # the work itself (~180 us). Threads, not processes: on 2 cores, full data, batch 64, measured
    # 3.9k samples/s (1 thread), 3.3k (2 threads), 1.8k (2 processes: shipping rows costs more than
    # decoding a 64x64 PNG).
    workers = max(1, min(int(cfg.data.num_workers), os.cpu_count() or 1))
    return data.batch(batch_size, drop_remainder=drop_remainder, num_parallel_workers=workers,
                      per_batch_map=_BatchTransform(transform), input_columns=list(records.EXAMPLE_COLUMNS),
                      output_columns=list(COLUMNS), python_multiprocessing=False).project(list(COLUMNS))


class _BatchTransform:
    """Applies an `ExampleTransform` to every row of a batch and stacks the 13 columns."""

    def __init__(self, transform: ExampleTransform) -> None:
        self.transform = transform

    def __call__(self, sample_ids, images, image_ids, question_ids, caption_ids, answer_ids, batch_info=None):
        examples = [self.transform(*row) for row in zip(images, image_ids, question_ids, caption_ids, answer_ids)]
        return tuple(np.stack(column) for column in zip(*examples))
