"""Reading a built data root with mindspore.dataset: per-rank shards, per-modality workers, packing, resume.

Each row of `<split>.mindrecord` (sample id, image bytes, image / question / caption / answer ids)
becomes one example: the image decoded (and augmented in training) by Pillow, the question and caption
tokenised, a spoken version of the question as a padded log-mel (librosa), the answer as a class id and
as LM tokens, and two flags saying which question modality the model sees. Everything goes through
`mindvl.preprocess`, the same code the server and the device use.

Pipeline: MindDataset (this rank's rows, in the order below) -> batch, whose workers decode and augment
images -> a map whose workers build the audio columns -> a map whose workers build the text columns ->
(training) a map that packs the batch's texts, clips and fusion sequences (mindvl/data/packing.py).
Each stage has its own `data.num_workers` threads, so the three modalities are prepared in parallel, a
batch at a time (a per-row map costs MindSpore ~200 us of conversions per row, more than the work itself).

Order and randomness are functions of (data.seed, epoch, sample id) only, never of worker scheduling:
  - epoch e visits the training rows in the permutation seeded by (seed, e), a global batch of
    data.batch_size (G) rows per optimizer step: step b is rows [b*G, (b+1)*G) of it. With R ranks
    (`num_shards` / `shard_id`, from the communication context when it is initialised) and
    A = train.grad_accumulation, a step is R*A chunks of G/(R*A) rows and micro-batch m of rank r is
    chunk m*R + r (`global_batches`). So 1 rank x G, 2 ranks x G/2 and 1 rank x 2 micro-batches of G/2
    see the same samples per optimizer step, and every rank reads the same number of micro-batches, so
    collectives never wait on a rank that ran out;
  - every random choice for a sample (which clip of its question, which question modality,
    augmentation) is drawn from a generator seeded by (seed, epoch, sample id, purpose).
So a position (epoch, optimizer steps consumed, micro-batches of the next step consumed), the same on
every rank, is the whole loader state: `TrainStream` resumes from it and yields exactly the
micro-batches an uninterrupted run would have, whatever the number of data workers.

Validation: with data.validation_fraction > 0, a share of the train split's images (chosen by a hash of
(data.seed, image_id), so all questions of an image go together) is held out: training never reads
their rows, the "validation" split is exactly those rows (heard in the training voices, since they are
training questions; no augmentation, fixed order, like "test").

Audio: training picks one of the question's training-voice clips per sample and epoch (voice
augmentation; speed, pitch and noise perturbation on top when data.augment enables them); the test
split picks a test-voice clip deterministically, so evaluation hears only speakers training never heard.
"""
from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.config import Config, ConfigError, PreprocessConfig
from mindvl.data.packing import FUSION_COLUMNS, PACK_COLUMNS, PACK_INPUTS, Packer, SampleSizes

COLUMNS = ("sample_id", "image", "question_ids", "question_mask", "audio_mel", "audio_mask", "use_text",
           "use_audio", "caption_ids", "caption_mask", "answer", "answer_tokens", "question_group",
           "caption_group")
# What the training graph consumes (mindvl.train.losses.MultimodalLoss), in its argument order: the
# labels, then the model's inputs, where questions, captions and clips arrive packed (PACK_COLUMNS).
LABEL_COLUMNS = ("answer", "answer_tokens", "question_group", "caption_group")
MODEL_COLUMNS = ("image", *PACK_COLUMNS)
TRAIN_COLUMNS = LABEL_COLUMNS + MODEL_COLUMNS
# The same from cached frozen-encoder states (model.pretrained.cache; cells.TokenInputModel): the encoders'
# outputs per sample, zero at padding, and the fusion's packing.
TOKEN_COLUMNS = ("image_tokens", "question_tokens", "question_mask", "caption_tokens", "caption_mask",
                 "audio_tokens", "audio_mask", *FUSION_COLUMNS)
TOKEN_TRAIN_COLUMNS = LABEL_COLUMNS + TOKEN_COLUMNS
MODALITIES = ("mix", "text", "audio", "both")
_FLAGS = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))  # (use_text, use_audio) for [text, audio, both]
_CLIP, _MODALITY, _IMAGE, _AUDIO, _TEXT, _HOLDOUT = range(6)  # purposes of per-sample random draws
SPLITS = ("train", "validation", "test")


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


# ----------------------------------------------------------------------------- order and randomness

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


def _generator(*values: int) -> np.random.Generator:
    return np.random.default_rng(_mix(*values))


def data_parallel_context(shard_id: Optional[int] = None, num_shards: Optional[int] = None) -> Tuple[int, int]:
    """(shard_id, num_shards): the given values, else this process's rank and group size when
    mindspore.communication is initialised (msrun), else (0, 1)."""
    if shard_id is None or num_shards is None:
        from mindspore.communication import management as communication

        if communication.GlobalComm.INITED:
            shard_id = communication.get_rank() if shard_id is None else shard_id
            num_shards = communication.get_group_size() if num_shards is None else num_shards
        else:
            shard_id, num_shards = shard_id or 0, num_shards or 1
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id={shard_id}, num_shards={num_shards}: expected 0 <= shard_id < num_shards")
    return int(shard_id), int(num_shards)


def epoch_order(count: int, seed: int, epoch: int, shuffle: bool, shard_id: int = 0, num_shards: int = 1,
                equal_shards: bool = True) -> np.ndarray:
    """Row indices rank `shard_id` reads in `epoch`.

    equal_shards (training): every rank gets count // num_shards rows of the epoch's permutation (the
    last count % num_shards rows of that permutation wait for the next epoch's); otherwise (evaluation)
    an exact partition: rank r reads positions r, r + num_shards, ... so every row is read once.
    """
    order = _generator(seed, epoch).permutation(count) if shuffle else np.arange(count)
    if equal_shards:
        share = count // num_shards
        return order[shard_id * share:(shard_id + 1) * share]
    return order[shard_id::num_shards]


def micro_batch_size(batch_size: int, num_shards: int, accumulation: int) -> int:
    """Rows one rank reads per micro-batch: the global batch `batch_size` (data.batch_size) split evenly
    among `num_shards` ranks and `accumulation` (train.grad_accumulation) micro-batches; a ConfigError
    naming the nearest valid batch sizes when it does not split."""
    unit = num_shards * accumulation
    if batch_size >= unit and batch_size % unit == 0:
        return batch_size // unit
    lower = batch_size // unit * unit
    nearest = " or ".join(str(n) for n in (lower, lower + unit) if n > 0)
    raise ConfigError(f"data.batch_size: {batch_size} is the global batch per optimizer step and must split evenly "
                      f"among {num_shards} worker(s) x train.grad_accumulation={accumulation} micro-batches (a "
                      f"multiple of {unit}); set data.batch_size to {nearest}, or change train.grad_accumulation")


def global_batches(order: np.ndarray, batch_size: int, num_shards: int = 1, accumulation: int = 1) -> np.ndarray:
    """An epoch's order cut into optimizer steps: (steps, accumulation, num_shards, micro) row indices.

    Step b is order[b*G:(b+1)*G] (G = batch_size; the last len(order) % G rows wait for the next epoch's
    order); [b, m, r] is micro-batch m of rank r, chunk m*num_shards + r of that step, so at accumulation 1
    the ranks' rows gathered in rank order are the step's rows in order.
    """
    micro = micro_batch_size(batch_size, num_shards, accumulation)
    steps = len(order) // batch_size
    return np.asarray(order[:steps * batch_size]).reshape(steps, accumulation, num_shards, micro)


# ----------------------------------------------------------------------------- validation hold-out

_IMAGE_IDS: Dict[Tuple, np.ndarray] = {}
_IMAGE_IDS_LOCK = threading.Lock()


def _image_ids(files: List[str]) -> np.ndarray:
    """The image_id column of a split's tables in row order, read once per process (only that column)
    and cached by the files' (path, size, mtime)."""
    from mindvl.data import records

    key = tuple((str(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)
    with _IMAGE_IDS_LOCK:
        if key not in _IMAGE_IDS:
            _IMAGE_IDS[key] = np.asarray([int(row["image_id"]) for path in files
                                          for row in records.read_table(path, ["image_id"])], np.int64)
        return _IMAGE_IDS[key]


def validation_images(image_ids: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The held-out image ids (sorted): the round(fraction * images) images (at least one, never all) of
    smallest hash of (seed, image_id); none when fraction is 0. Depends on the image ids and the seed
    only, so every rank and every run of a recipe holds out the same images."""
    images = np.unique(image_ids)
    if fraction <= 0:
        return images[:0]
    keep = min(len(images) - 1, max(1, int(round(fraction * len(images)))))
    ranked = sorted(images.tolist(), key=lambda i: (_mix(seed, i, _HOLDOUT), i))
    return np.sort(np.asarray(ranked[:keep], np.int64))


def split_rows(cfg: Config, split: str) -> np.ndarray:
    """Row indices (= sample ids) of `split` in its table, ascending: "test" every test row; "train" the
    train table's rows except the held-out images' (data.validation_fraction); "validation" exactly those."""
    root, files, count = _open_split(cfg, split)
    fraction = float(cfg.data.validation_fraction)
    if split == "test" or (split == "train" and fraction == 0):
        return np.arange(count)
    held = validation_images(_image_ids(files), fraction, int(cfg.data.seed))
    if split == "validation" and len(held) == 0:
        raise ConfigError(f"split 'validation': {root} has a single training image, too few to hold one out; "
                          f"build more data or set data.validation_fraction: 0")
    in_validation = np.isin(_image_ids(files), held)
    return np.flatnonzero(in_validation if split == "validation" else ~in_validation)


# ----------------------------------------------------------------------------- per-process tables

class _Tables:
    """Per-process caches: tokenised questions/captions/answers, the clip table, waveforms and mels."""

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

    def clip_of(self, split: str, question_id: int) -> List[int]:
        clips = self.clips.get(question_id)
        if not clips:
            raise P.InputError(f"{split} question {question_id}: no spoken clip in speech.mindrecord; "
                               f"rebuild the data set with `mindvl data build --force`")
        return clips

    def waveform(self, clip: int) -> np.ndarray:
        return self._from_pcm16(self.pcm[clip])

    def mel(self, clip: int) -> Tuple[np.ndarray, np.ndarray]:
        """The clip's padded log-mel and frame mask, computed once per process."""
        if clip not in self._mels:
            name = self.names[clip]
            self._mels[clip] = P.pad_mel(P.log_mel(self.waveform(clip), self.pre, name=name), self.pre, name=name)
        return self._mels[clip]


def _voices(split: str) -> str:
    """Whose clips a split hears: validation questions are training questions, so the training voices."""
    return "test" if split == "test" else "train"


class _Stage:
    """A picklable batch transform: carries settings only and loads `_Tables` once per process."""

    def __init__(self, root: Union[str, Path], cfg: Config, split: str, epoch: int, tokens=None) -> None:
        self.root = str(root)
        self.tokens = tokens  # EncoderTokens: the stage hands on cached encoder states instead of inputs
        self.pre = cfg.preprocess
        self.augment = cfg.data.augment
        self.seed = int(cfg.data.seed)
        self.split = split
        self.train = split == "train"
        self.epoch = int(epoch)
        self._tables = None
        self._lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_tables"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def tables(self) -> _Tables:
        tables = self._tables
        if tables is None or tables.pid != os.getpid():
            with self._lock:  # worker threads share one copy; load it once
                if self._tables is None or self._tables.pid != os.getpid():
                    self._tables = _Tables(Path(self.root), self.pre, _voices(self.split))
                tables = self._tables
        return tables

    @property
    def augmenting(self) -> bool:
        return self.train and self.augment.enabled


class _ImageStage(_Stage):
    """Batch op: encoded images -> float32 (B, 3, S, S); random-resized-crop, flip, jitter in training.
    With cached states: (B, 1 + N, vision width)."""

    def __call__(self, images, sample_ids, batch_info=None):
        from mindvl.data.augment import augment_image

        pixels = []
        for data, sample_id in zip(images, sample_ids):
            name = f"{self.split} sample {int(sample_id)} image"
            if self.tokens is not None:
                pixels.append(self.tokens.image(_as_bytes(data), name))
            elif self.augmenting:
                img = P.open_image(_as_bytes(data), name=name)
                img = augment_image(img, self.augment, self.pre.image_size,
                                    _generator(self.seed, self.epoch, int(sample_id), _IMAGE))
                pixels.append(P.image_to_array(img, self.pre))
            else:
                pixels.append(P.decode_image(_as_bytes(data), self.pre, name=name))
        return np.stack(pixels), np.asarray(sample_ids)


class _AudioStage(_Stage):
    """Map: question ids -> the padded log-mel of one spoken clip (B, n_mels, T) and frame mask (B, T).
    With cached states: the clip's states (B, T/2, audio width) instead of the mel."""

    def __call__(self, sample_ids, question_ids):
        tables = self.tables
        mels, masks = [], []
        for sample_id, question_id in zip(sample_ids.tolist(), question_ids.tolist()):
            clips = tables.clip_of(self.split, question_id)
            if self.train:
                clip = clips[_mix(self.seed, self.epoch, sample_id, _CLIP) % len(clips)]
            else:
                clip = clips[sample_id % len(clips)]
            if self.tokens is not None:
                mel, mask = self.tokens.clip(tables.pcm[clip], tables.names[clip]), tables.mel(clip)[1]
            else:
                mel, mask = self._perturbed(tables, clip, sample_id) if self._perturbs() else tables.mel(clip)
            mels.append(mel)
            masks.append(mask)
        return sample_ids, question_ids, np.stack(mels), np.stack(masks)

    def _perturbs(self) -> bool:
        a = self.augment
        return self.augmenting and (a.speed != [1.0, 1.0] or a.pitch > 0 or a.noise > 0)

    def _perturbed(self, tables: _Tables, clip: int, sample_id: int) -> Tuple[np.ndarray, np.ndarray]:
        """Speed / pitch / noise on the waveform; a clip that no longer fits max_audio_frames keeps its
        unperturbed mel (the build only admits clips that fit)."""
        from mindvl.data.augment import augment_waveform

        audio = augment_waveform(tables.waveform(clip), self.augment, self.pre.sample_rate,
                                 _generator(self.seed, self.epoch, sample_id, _AUDIO))
        name = tables.names[clip]
        try:
            return P.pad_mel(P.log_mel(audio, self.pre, name=name), self.pre, name=name)
        except P.InputError:
            return tables.mel(clip)


class _TextStage(_Stage):
    """Map: ids -> question / caption tokens and masks, answer class and tokens, groups, modality flags."""

    def __init__(self, root, cfg: Config, split: str, epoch: int, modality: str, tokens=None) -> None:
        super().__init__(root, cfg, split, epoch, tokens)
        self.modality = modality
        self.cumulative_mix = np.cumsum(np.asarray(cfg.data.question_modality_mix, np.float64)).tolist()

    def __call__(self, sample_ids, question_ids, caption_ids, answer_ids):
        from mindvl.data.augment import mask_tokens

        tables = self.tables
        tok = tables.tokenizer
        columns = defaultdict(list)
        for sample_id, qid, cid, aid in zip(sample_ids.tolist(), question_ids.tolist(), caption_ids.tolist(),
                                            answer_ids.tolist()):
            q_ids, q_mask = tables.question(qid)
            if self.augmenting and self.augment.token_mask > 0:
                q_ids = mask_tokens(q_ids, q_mask, self.augment.token_mask, tok.unk_id,
                                    {tok.pad_id, tok.cls_id, tok.sep_id},
                                    _generator(self.seed, self.epoch, sample_id, _TEXT))
            c_ids, c_mask = tables.caption(cid)
            use_text, use_audio = self._flags(sample_id)
            for name, value in (("question_ids", q_ids), ("question_mask", q_mask), ("caption_ids", c_ids),
                                ("caption_mask", c_mask), ("answer", np.int32(aid)),
                                ("answer_tokens", tables.answer_tokens(aid)), ("question_group", np.int32(qid)),
                                ("caption_group", np.int32(cid)), ("use_text", np.float32(use_text)),
                                ("use_audio", np.float32(use_audio))):
                columns[name].append(value)
            if self.tokens is not None:
                columns["question_tokens"].append(self.tokens.text(q_ids, q_mask, f"question {qid}"))
                columns["caption_tokens"].append(self.tokens.text(c_ids, c_mask, f"caption {cid}"))
        return (sample_ids, *(np.stack(columns[name]) for name in self.outputs))

    @property
    def outputs(self) -> Tuple[str, ...]:
        return _TEXT_OUTPUTS + (_TOKEN_TEXT_OUTPUTS if self.tokens is not None else ())

    def _flags(self, sample_id: int) -> Tuple[float, float]:
        if self.modality != "mix":
            return _FLAGS[("text", "audio", "both").index(self.modality)]
        u = _uniform(self.seed, self.epoch, sample_id, _MODALITY)
        for flags, edge in zip(_FLAGS, self.cumulative_mix):
            if u < edge:
                return flags
        return _FLAGS[-1]


_TEXT_OUTPUTS = ("question_ids", "question_mask", "caption_ids", "caption_mask", "answer", "answer_tokens",
                 "question_group", "caption_group", "use_text", "use_audio")
_TOKEN_TEXT_OUTPUTS = ("question_tokens", "caption_tokens")


class _PackStage:
    """Map: the text, audio and modality columns -> the same columns and the packed layouts
    (mindvl/data/packing.py); with cached encoder states only the fusion is packed (FUSION_COLUMNS)."""

    def __init__(self, packer: Packer, fusion_only: bool = False) -> None:
        self.packer = packer
        self.fusion_only = fusion_only

    @property
    def inputs(self) -> Tuple[str, ...]:
        return _FUSION_PACK_INPUTS if self.fusion_only else PACK_INPUTS

    @property
    def outputs(self) -> Tuple[str, ...]:
        return FUSION_COLUMNS if self.fusion_only else PACK_COLUMNS

    def __call__(self, *columns):  # self.inputs, in order
        packed = self.packer.fusion(*columns) if self.fusion_only else self.packer(*columns)
        return (*columns, *packed.arrays)


_FUSION_PACK_INPUTS = ("question_mask", "audio_mask", "use_text", "use_audio")  # FusionPacker's arguments


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


def _open_split(cfg: Config, split: str) -> Tuple[Path, List[str], int]:
    """(root, table files, row count of those files) of a split, after checking the root is usable;
    "validation" reads the train table (its rows: `split_rows`)."""
    from mindvl.data import records

    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {list(SPLITS)}")
    if split == "validation" and not cfg.data.validation_fraction > 0:
        raise ConfigError("split 'validation': data.validation_fraction is 0, so no training images are held out; "
                          "set data.validation_fraction (e.g. 0.1) to evaluate on a validation split")
    table = "test" if split == "test" else "train"
    root = Path(cfg.data.root)
    if not root.is_dir():
        raise DataRootError(f"data root {root} does not exist; build it first with "
                            f"`mindvl data build --config <recipe>` (or set data.root)")
    files = records.table_files(root, table)
    for path in files:
        _require(root, Path(path).name)
    meta = load_meta(root)
    _check_compatible(root, meta, cfg.preprocess)
    return root, files, int(meta["counts"][table]["examples"])


def sample_sizes(cfg: Config, split: str = "train") -> SampleSizes:
    """Every example's question and caption token counts and its question's clip frame counts, read from
    the data root without decoding any image or computing any mel: what sizes the packer's buckets."""
    from mindvl.data import records

    root, files, _ = _open_split(cfg, split)
    voices = _voices(split)
    tables = _Tables(root, cfg.preprocess, voices)
    rows = [row for path in files for row in records.read_table(path, ["question_id", "caption_id"])]
    rows = [rows[i] for i in split_rows(cfg, split)]
    questions = {qid: int(tables.question(qid)[1].sum()) for qid in {int(r["question_id"]) for r in rows}}
    captions = {cid: int(tables.caption(cid)[1].sum()) for cid in {int(r["caption_id"]) for r in rows}}
    hop = cfg.preprocess.hop_length  # log_mel keeps samples // hop frames
    frames = {qid: np.array([len(tables.pcm[c]) // 2 // hop for c in tables.clip_of(voices, qid)])
              for qid in questions}  # pcm16: two bytes per sample
    return SampleSizes(np.array([questions[int(r["question_id"])] for r in rows]),
                       np.array([captions[int(r["caption_id"])] for r in rows]),
                       [frames[int(r["question_id"])] for r in rows], tuple(cfg.data.question_modality_mix))


def _pipeline(cfg: Config, split: str, files: List[str], rows: np.ndarray, epoch: int, modality: str,
              batch_size: int, drop_remainder: bool, packer: Optional[Packer], tokens=None):
    """The mindspore.dataset pipeline over `rows` (in that order); see the module docstring. With
    `tokens` (EncoderTokens) the stages hand on cached encoder states and the columns are TOKEN_COLUMNS'."""
    import mindspore.dataset as ds

    from mindvl.data import records

    root = Path(cfg.data.root)
    workers = max(1, min(int(cfg.data.num_workers), os.cpu_count() or 1))
    threads = {"num_parallel_workers": workers, "python_multiprocessing": False}
    image, audio = ("image_tokens", "audio_tokens") if tokens is not None else ("image", "audio_mel")
    data = ds.MindDataset(files, columns_list=list(records.EXAMPLE_COLUMNS),
                          sampler=ds.SubsetSampler([int(i) for i in rows]))
    data = data.batch(batch_size, drop_remainder=drop_remainder,
                      per_batch_map=_ImageStage(root, cfg, split, epoch, tokens),
                      input_columns=["image", "sample_id"], output_columns=[image, "sample_id"], **threads)
    data = data.map(_AudioStage(root, cfg, split, epoch, tokens), input_columns=["sample_id", "question_id"],
                    output_columns=["sample_id", "question_id", audio, "audio_mask"], **threads)
    text = _TextStage(root, cfg, split, epoch, modality, tokens)
    data = data.map(text, input_columns=["sample_id", "question_id", "caption_id", "answer_id"],
                    output_columns=["sample_id", *text.outputs], **threads)
    columns = list(COLUMNS)
    if tokens is not None:
        columns = [{"image": image, "audio_mel": audio}.get(name, name) for name in columns] + list(_TOKEN_TEXT_OUTPUTS)
    if packer is not None:
        pack = _PackStage(packer, fusion_only=tokens is not None)
        data = data.map(pack, input_columns=list(pack.inputs), output_columns=[*pack.inputs, *pack.outputs],
                        **threads)
        columns += list(pack.outputs)
    return data.project(columns)


def split_inputs(cfg: Config, split: str = "train") -> Tuple[List[bytes], List, List[bytes]]:
    """What the encoders see over a split, each distinct input once: encoded images, (ids, mask) of the
    questions and captions, and every clip of those questions in that split's voices (int16). A training
    rank needs them all: its share of the rows changes from epoch to epoch. "train" covers the whole train
    table, held-out validation rows included (so one token cache serves training and validation);
    "validation" only the held-out rows."""
    from mindvl.data import records

    root, files, _ = _open_split(cfg, split)
    voices = _voices(split)
    tables = _Tables(root, cfg.preprocess, voices)
    rows = [row for path in files for row in records.read_table(path, ["image", "question_id", "caption_id"])]
    if split == "validation":
        rows = [rows[i] for i in split_rows(cfg, split)]
    images = list({_as_bytes(row["image"]): None for row in rows})
    questions = sorted({int(row["question_id"]) for row in rows})
    captions = sorted({int(row["caption_id"]) for row in rows})
    texts = [tables.question(qid) for qid in questions] + [tables.caption(cid) for cid in captions]
    clips = [tables.pcm[clip] for qid in questions for clip in tables.clip_of(voices, qid)]
    return images, texts, clips


def create_dataset(cfg: Config, split: str, *, shuffle: Optional[bool] = None, question_modality: str = "mix",
                   batch_size: Optional[int] = None, drop_remainder: Optional[bool] = None, epoch: int = 0,
                   shard_id: Optional[int] = None, num_shards: Optional[int] = None, packed: bool = False,
                   tokens=None):
    """One epoch of batches over `split` with the columns in `COLUMNS` (+ `PACK_COLUMNS` if `packed`).
    With `tokens` (EncoderTokens, filled for the split): the cached encoder states instead of the
    encoders' inputs, image -> image_tokens, audio_mel -> audio_tokens, plus question_tokens and
    caption_tokens (+ FUSION_COLUMNS if `packed`).

    Shapes (B = batch, S = image_size, Lt = max_text_length, Ta = max_audio_frames, La = max_answer_length):
      sample_id i64 (B,); image f32 (B,3,S,S); question_ids i32 (B,Lt); question_mask f32 (B,Lt);
      audio_mel f32 (B,n_mels,Ta); audio_mask f32 (B,Ta); use_text f32 (B,); use_audio f32 (B,);
      caption_ids i32 (B,Lt); caption_mask f32 (B,Lt); answer i32 (B,); answer_tokens i32 (B,La);
      question_group i32 (B,) (= question id); caption_group i32 (B,) (= caption id).
    `question_modality`: "mix" samples [text, audio, both] with data.question_modality_mix; "text",
    "audio", "both" fix the flags. Defaults: shuffle, drop_remainder and augmentation for "train",
    none of them for "validation" and "test". `epoch` seeds the order and every random choice (module
    docstring). "train" is the training rows (held-out images excluded), "validation" the held-out rows
    (a ConfigError when data.validation_fraction is 0). `batch_size` (default data.batch_size) is this
    rank's batch. The shard comes from `data_parallel_context`: equal shares with drop_remainder, an
    exact partition without (evaluation: every example counted once over all ranks). Training itself
    reads through `TrainStream` (global batches, micro-batches, resume).
    """
    if question_modality not in MODALITIES:
        raise ValueError(f"question_modality {question_modality!r}: expected one of {list(MODALITIES)}")
    shard_id, num_shards = data_parallel_context(shard_id, num_shards)
    _, files, _ = _open_split(cfg, split)
    train = split == "train"
    shuffle = train if shuffle is None else bool(shuffle)
    drop_remainder = train if drop_remainder is None else bool(drop_remainder)
    batch_size = int(batch_size or cfg.data.batch_size)
    of_split = split_rows(cfg, split)
    rows = of_split[epoch_order(len(of_split), cfg.data.seed, epoch, shuffle, shard_id, num_shards,
                                equal_shards=drop_remainder)]
    packer = Packer.from_config(cfg, batch_size, sample_sizes(cfg, "train")) if packed else None
    return _pipeline(cfg, split, files, rows, epoch, question_modality, batch_size, drop_remainder, packer, tokens)


# ----------------------------------------------------------------------------- training stream

@dataclass
class DataPosition:
    """Where the training stream stands, the same on every rank: `batch` optimizer steps (global batches)
    of `epoch` consumed, and `micro` micro-batches of the next one (0 right after an optimizer step)."""

    epoch: int = 0
    batch: int = 0
    micro: int = 0


# What fixes the order: a state whose values differ cannot be continued. Missing in states written
# before global batches: accumulation 1, no validation hold-out (their single-rank order is this one).
_ORDER_KEYS = {"seed": None, "examples": None, "batch_size": None, "num_shards": None, "accumulation": 1,
               "validation_fraction": 0.0}
_ORDER_SETTINGS = {"seed": "data.seed", "examples": "the data set's training examples",
                   "batch_size": "data.batch_size (the global batch)", "num_shards": "the msrun worker count",
                   "accumulation": "train.grad_accumulation", "validation_fraction": "data.validation_fraction"}


class TrainStream:
    """Packed training micro-batches forever, from a resumable position (see the module docstring).

    An optimizer step takes `accumulation` consecutive micro-batches of `micro_batch_size` rows from each
    of the `num_shards` ranks: `batch_size` (data.batch_size, global) rows in all; `steps_per_epoch`
    counts optimizer steps. Iterating yields (sample_ids (micro,) numpy, tuple of mindspore Tensors in
    `columns` order: TRAIN_COLUMNS, or TOKEN_TRAIN_COLUMNS when `tokens`
    (mindvl.pretrained.tokens.EncoderTokens, filled) hands on cached encoder states) and advances
    `position` before each yield, so `state()` taken after a step describes exactly what was consumed.
    The packer is built for the micro-batch.
    """

    def __init__(self, cfg: Config, shard_id: Optional[int] = None, num_shards: Optional[int] = None,
                 state: Optional[Dict] = None, tokens=None) -> None:
        self.cfg = cfg
        self.tokens = tokens
        self.columns = TOKEN_TRAIN_COLUMNS if tokens is not None else TRAIN_COLUMNS
        self.shard_id, self.num_shards = data_parallel_context(shard_id, num_shards)
        _, self.files, self.count = _open_split(cfg, "train")
        self.rows = split_rows(cfg, "train")  # training rows: the held-out validation images excluded
        self.batch_size = int(cfg.data.batch_size)
        self.accumulation = int(cfg.train.grad_accumulation)
        self.micro_batch_size = micro_batch_size(self.batch_size, self.num_shards, self.accumulation)
        self.steps_per_epoch = len(self.rows) // self.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"data.batch_size: the global batch of {self.batch_size} is more than the "
                              f"{len(self.rows)} training examples in {cfg.data.root}; lower it or build more data")
        self.packer = Packer.from_config(cfg, self.micro_batch_size, sample_sizes(cfg, "train"))
        self.position = DataPosition()
        if state is not None:
            self.load_state(state)

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The row indices (= sample ids) this rank reads in `epoch`: (steps_per_epoch, accumulation, micro)."""
        order = self.rows[epoch_order(len(self.rows), self.cfg.data.seed, epoch, True)]
        return global_batches(order, self.batch_size, self.num_shards, self.accumulation)[:, :, self.shard_id]

    def state(self) -> Dict:
        """The loader state for the train state: position, consumed samples (over all ranks) and what fixes
        the order. The position is the same on every rank, so any rank's state resumes every rank."""
        p = self.position
        return {**asdict(p),
                "samples": (p.epoch * self.steps_per_epoch + p.batch) * self.batch_size
                + p.micro * self.micro_batch_size * self.num_shards,
                "seed": self.cfg.data.seed, "shard_id": self.shard_id, "num_shards": self.num_shards,
                "batch_size": self.batch_size, "accumulation": self.accumulation,
                "micro_batch_size": self.micro_batch_size, "examples": self.count,
                "validation_fraction": float(self.cfg.data.validation_fraction), "training_examples": len(self.rows),
                "rng": "counter-based: every draw is seeded by (seed, epoch, sample_id)"}

    def load_state(self, state: Dict) -> None:
        """Continue from `state` (from `state()`); refuses one whose order this stream cannot reproduce."""
        mine = self.state()
        if "accumulation" not in state and state.get("num_shards", 1) > 1:
            raise ConfigError(f"resume: the checkpoint's data state comes from a loader that gave each of its "
                              f"{state['num_shards']} ranks a contiguous share of the epoch, an order this one "
                              f"(global batches) cannot continue; start a fresh run")
        for key, default in _ORDER_KEYS.items():
            theirs = state.get(key, default)
            if theirs is not None and theirs != mine[key]:
                raise ConfigError(f"resume: the checkpoint's data {key} is {theirs} but this run has {mine[key]} "
                                  f"({_ORDER_SETTINGS[key]}); resume with the same data set, data.seed, "
                                  f"data.batch_size, data.validation_fraction, train.grad_accumulation and "
                                  f"worker count")
        position = DataPosition(int(state["epoch"]), int(state["batch"]), int(state.get("micro", 0)))
        if position.micro >= self.accumulation:
            raise ConfigError(f"resume: the checkpoint's data state is {position.micro} micro-batches into a step "
                              f"of {self.accumulation}")
        self.position = position

    def _epoch(self, epoch: int, start: int):
        """The pipeline over this rank's rows of `epoch` from its micro-batch `start` on."""
        rows = self.epoch_rows(epoch).reshape(-1)[start * self.micro_batch_size:]
        return _pipeline(self.cfg, "train", self.files, rows, epoch, "mix", self.micro_batch_size, True,
                         self.packer, self.tokens)

    def __iter__(self) -> Iterator[Tuple[np.ndarray, tuple]]:
        while True:
            if self.position.batch >= self.steps_per_epoch:
                self.position = DataPosition(self.position.epoch + 1, 0, 0)
            p = self.position
            iterator = self._epoch(p.epoch, p.batch * self.accumulation + p.micro).create_dict_iterator(num_epochs=1)
            try:
                for batch in iterator:
                    micro = self.position.micro + 1
                    self.position = DataPosition(p.epoch, self.position.batch + micro // self.accumulation,
                                                 micro % self.accumulation)
                    yield batch["sample_id"].asnumpy(), tuple(batch[name] for name in self.columns)
            finally:  # closing the generator (end of training) stops the pipeline's prefetching workers
                iterator.stop()
