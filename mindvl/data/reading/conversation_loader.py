"""Reading a built root's conversation tables (records.CONVERSATION_SCHEMA) for the generative model.

Each row becomes one rendered conversation (mindvl.chat: the recipe's template and decoder tokenizer, its
image and audio placeholders as the model's slot counts, limited to data.packing.length tokens), its image
decoded (augmented in training, as the classifier's loader does), its audio as a padded log-mel: the
conversation's own recording, or for a spoken easy-VQA question one of its clips, drawn per (seed, epoch,
sample id) in training and fixed in the test split, which hears only voices training never heard; in
training both are speed / pitch / noise perturbed when data.augment asks for it (Stage.spoken). A batch
of them is packed by ConversationPacker into rows of data.packing.length tokens, and the columns are what
MultimodalLMLoss takes: CONVERSATION_TRAIN_COLUMNS.

Pipeline: MindDataset (the rows, in order) -> batch, whose data.num_workers threads decode, render and
pack (a per-row map costs MindSpore more in conversions than this work). Order and randomness are those
of mindvl/data/reading/loader.py: functions of (data.seed, epoch, sample id), never of worker scheduling, so
ConversationStream resumes exactly from a position.

Sizes: before training every conversation of the split is rendered once (text only, ~50 us each) to
count its tokens and labels. One whose attachments do not fit a row cannot be trained on: it is left
out, counted and named in a warning, never a crash mid-epoch. The row and label buckets are calibrated
from those sizes (calibrate_rows over drawn batches), with the largest possible batch as the last
bucket, so every batch has a shape and graph mode compiles once per bucket met.

Frozen encoders' cached states (model.pretrained.cache, mindvl.pretrained.tokens): the stage then hands on
each image's vision states and each clip's audio states in the attachment columns instead of pixels and
mels (zeros for a missing attachment; the frame mask stays), what MultimodalLM.construct_from_tokens takes.
`conversation_inputs` lists what the cache is filled with.

Validation: with data.validation_fraction > 0 the conversations of the classifier's held-out images
(mindvl.data.reading.splits.validation_images) form the "validation" split and training never reads them, so
both models are validated on the same images; a conversation without an image always trains.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl import preprocess as P
from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, ChatEncoder, conversation_turns, placeholder_count, recipe_chat
from mindvl.config import Config, DataConfig
from mindvl.data import records
from mindvl.data.reading.conversation_packing import CONVERSATION_COLUMNS, ConversationPacker
from mindvl.data.reading.order import epoch_order
from mindvl.data.reading.packing import CALIBRATION_BATCHES, calibrate_rows, pack_rows
from mindvl.data.reading.splits import image_ids_of, open_split, validation_images
from mindvl.data.reading.stages import Stage, Tables, voices_of
from mindvl.data.reading.stream import ResumableStream
from mindvl.data.root import load_meta
from mindvl.errors import ConfigError

ATTACHMENT_COLUMNS = ("image", "mel", "frame_mask")
# what MultimodalLMLoss takes, in its argument order: labels, weight, then the model's inputs
CONVERSATION_TRAIN_COLUMNS = CONVERSATION_COLUMNS + ATTACHMENT_COLUMNS
TABLE_COLUMNS = ("sample_id", "turns", "image", "question_id", "pcm")  # what the stage reads of a row
LABEL_ALIGN = 8  # label buckets are multiples of it


def conversation_files(cfg: Config, split: str) -> Tuple[Path, List[str], int]:
    """(root, table files, row count) of a split's conversations; "validation" reads the train table."""
    root, _, _ = open_split(cfg, split)
    table = "test" if split == "test" else "train"
    meta = load_meta(root)
    if records.conversation_table(table) not in meta.get("tables", {}):
        raise ConfigError(f"data root {root} has no conversation tables (built before the generative model); "
                          f"rebuild it with `mindvl data build --config <recipe> --force`")
    return root, records.table_files(root, records.conversation_table(table)), int(meta["counts"][table]["conversations"])


def conversation_rows(cfg: Config, split: str) -> np.ndarray:
    """Row indices of `split` in its conversation table: "test" all; "train" all but the conversations that show
    a held-out validation image; "validation" those that show only held-out images (a "pair" of a held-out and a
    training image is in neither)."""
    root, files, count = conversation_files(cfg, split)
    fraction = float(cfg.data.validation_fraction)
    if split == "test" or (split == "train" and fraction == 0):
        return np.arange(count)
    _, example_files, _ = open_split(cfg, "train")
    held = validation_images(image_ids_of(example_files), fraction, int(cfg.data.seed))
    ids = np.asarray([(int(row["image_id"]), int(row["other_image_id"])) for path in files
                      for row in records.read_table(path, ["image_id", "other_image_id"])], np.int64).reshape(-1, 2)
    held_out = np.isin(ids, held) & (ids >= 0)  # per image of a row; a "pair" holds two
    if split == "validation":  # every image of the row held out
        return np.flatnonzero(held_out[:, 0] & (held_out[:, 1] | (ids[:, 1] < 0)))
    return np.flatnonzero(~held_out.any(axis=1))  # no image of the row held out


@dataclass
class ConversationSizes:
    """Per row of a conversation table: its rendered tokens and learnt labels, and why it cannot be packed
    ("" when it can)."""

    tokens: np.ndarray  # (N,) int
    labels: np.ndarray  # (N,) int
    refused: List[str]
    kinds: np.ndarray  # (N,) str: where each came from (data.conversation_kinds selects among them)

    def usable(self, rows: np.ndarray, kinds: Sequence[str] = ()) -> np.ndarray:
        """`rows` that can be packed, of `kinds` only when given."""
        return np.asarray([r for r in rows if not self.refused[r] and (not kinds or self.kinds[r] in kinds)],
                          np.int64)


def conversation_sizes(cfg: Config, split: str, chat: ChatEncoder) -> ConversationSizes:
    """Every conversation of `split`'s table rendered as training renders it, text only."""
    _, files, _ = conversation_files(cfg, split)
    length = int(cfg.data.packing.length)
    tokens, labels, refused, kinds = [], [], [], []
    for path in files:
        for row in records.read_table(path, ["conversation", "turns", "kind"]):
            kinds.append(str(row["kind"]))
            turns = conversation_turns(turns_json(row["turns"]))
            try:
                if placeholder_count(turns, IMAGE_SLOT) > 1:
                    raise P.InputError(f"conversation {row['conversation']}: {placeholder_count(turns, IMAGE_SLOT)} "
                                       f"images; this model takes one per conversation (a native-resolution VLM, "
                                       f"model.pretrained.vlm, takes several)")
                rendered = chat.render(turns, placeholder_count(turns, IMAGE_SLOT), placeholder_count(turns, AUDIO_SLOT),
                                       max_length=length, name=f"conversation {row['conversation']}")
            except P.InputError as exc:
                tokens.append(0), labels.append(0), refused.append(str(exc))
                continue
            tokens.append(len(rendered)), labels.append(int(rendered.learn[1:].sum())), refused.append("")
    return ConversationSizes(np.asarray(tokens), np.asarray(labels), refused, np.asarray(kinds))


def turns_json(value) -> list:
    import json

    return json.loads(value.decode() if isinstance(value, bytes) else str(value))


def conversation_packer(data: DataConfig, batch_size: int, sizes: ConversationSizes, rows: np.ndarray,
                        image_tokens: int, audio_tokens: int, pad_id: int = 0) -> ConversationPacker:
    """The packer for micro-batches of `batch_size` drawn from `rows`: data.packing.rows as the row buckets
    (empty: calibrated), label buckets calibrated, each list ending with what the largest batch needs."""
    length = int(data.packing.length)
    rng = np.random.default_rng(data.seed)
    needed_rows, needed_labels = [], []
    for _ in range(CALIBRATION_BATCHES):
        picks = rng.choice(rows, size=min(batch_size, len(rows)), replace=False)
        needed_rows.append(len(pack_rows(sizes.tokens[picks].tolist(), length)))
        needed_labels.append(int(sizes.labels[picks].sum()))
    row_buckets = list(data.packing.rows) or [min(r, batch_size) for r in calibrate_rows(needed_rows)]
    most_labels = int(np.sort(sizes.labels[rows])[::-1][:batch_size].sum())
    label_buckets = [_aligned(n) for n in calibrate_rows(needed_labels)] + [_aligned(most_labels)]
    return ConversationPacker(length, sorted({*row_buckets, batch_size}), sorted(set(label_buckets)), image_tokens,
                              audio_tokens, pad_id)


def _aligned(count: int) -> int:
    return max(LABEL_ALIGN, -(-count // LABEL_ALIGN) * LABEL_ALIGN)


def conversation_inputs(cfg: Config, split: str = "train") -> Tuple[List[bytes], List, List[bytes]]:
    """What the generative model's encoders see over a split's conversation table, each distinct input once
    (mindvl.data.reading.loader.split_inputs' counterpart, for EncoderTokens.fill): the encoded images, no texts (the
    decoder reads them), and the int16 clips: every clip of a spoken question in the split's voices (training
    draws among them per epoch) and each conversation's own recording. The whole table, validation rows
    included, so one cache serves training and validation."""
    root, files, _ = conversation_files(cfg, split)
    rows = [row for path in files for row in records.read_table(path, ["image", "question_id", "pcm"])]
    images = list({image: None for row in rows for image in records.images_of(row["image"])})
    questions = sorted({int(row["question_id"]) for row in rows if int(row["question_id"]) >= 0})
    clips = list({records.as_bytes(row["pcm"]): None for row in rows if records.as_bytes(row["pcm"])})
    if questions:
        voices = voices_of(split)
        tables = Tables(root, cfg.preprocess, voices)
        clips += [tables.pcm[clip] for qid in questions for clip in tables.clip_of(voices, qid)]
    return images, [], clips


class ConversationStage(Stage):
    """Batch op: conversation rows -> sample ids and CONVERSATION_TRAIN_COLUMNS (module docstring); with
    `tokens`, the encoders' cached states in the attachment columns."""

    def __init__(self, root, cfg: Config, split: str, epoch: int, chat: ChatEncoder, packer: ConversationPacker,
                 tokens=None):
        super().__init__(root, cfg, split, epoch, tokens)
        self.chat = chat
        self.packer = packer

    def __call__(self, sample_ids, turns, images, question_ids, pcms, batch_info=None):
        rendered, pixels, mels, masks = [], [], [], []
        for sample_id, text, image, question_id, pcm in zip(sample_ids, turns, images, question_ids, pcms):
            sample_id, question_id = int(sample_id), int(question_id)
            conversation = conversation_turns(turns_json(text))
            image, pcm = records.as_bytes(image), records.as_bytes(pcm)
            pixels.append(self.pixels(image, sample_id) if image else self._no_image())
            mel, mask = self.heard(question_id, pcm, sample_id)
            mels.append(mel)
            masks.append(mask)
            rendered.append(self.chat.render(conversation, int(bool(image)), int(question_id >= 0 or bool(pcm)),
                                             max_length=self.packer.length, name=f"conversation {sample_id}"))
        packed = self.packer(rendered)
        return (np.asarray(sample_ids), *packed.arrays, np.stack(pixels), np.stack(mels), np.stack(masks))

    def heard(self, question_id: int, pcm: bytes, sample_id: int) -> Tuple[np.ndarray, np.ndarray]:
        """What a conversation's audio slots hear: a spoken question's clip (`clip` draws it), its own recording, or
        nothing (zeros); its padded log-mel (the cached states with `tokens`) and frame mask."""
        if question_id >= 0:
            tables = self.tables
            clip = self.clip(tables, question_id, sample_id)
            if self.tokens is not None:
                return self.tokens.clip(tables.pcm[clip], tables.names[clip]), tables.mel(clip)[1]
            return self.spoken(tables, clip, sample_id)
        if pcm:
            return self._recording(pcm, sample_id)
        return self._no_audio()

    def _recording(self, pcm: bytes, sample_id: int) -> Tuple[np.ndarray, np.ndarray]:
        """A conversation's own clip -> its padded log-mel (perturbed as a question clip is in training; or
        its cached states) and frame mask."""
        from mindvl.data.records import from_pcm16

        name = f"{self.split} conversation {sample_id} audio"
        audio = from_pcm16(pcm)
        perturbed = self.perturbed_mel(audio, name, sample_id) if self.perturbs_audio else None
        if perturbed is not None:
            return perturbed
        mel, mask = P.speech_features(audio, self.pre, name=name)
        return (mel if self.tokens is None else self.tokens.clip(pcm, name)), mask

    def _no_image(self) -> np.ndarray:
        if self.tokens is not None:
            return self.tokens.blank("vision")
        return np.zeros((3, self.pre.image_size, self.pre.image_size), np.float32)

    def _no_audio(self) -> Tuple[np.ndarray, np.ndarray]:
        mask = np.zeros(self.pre.max_audio_frames, np.float32)
        if self.tokens is not None:
            return self.tokens.blank("audio"), mask
        return np.zeros((self.pre.n_mels, self.pre.max_audio_frames), np.float32), mask


def conversation_pipeline(cfg: Config, split: str, files: List[str], rows: np.ndarray, epoch: int, batch_size: int,
                          drop_remainder: bool, chat: ChatEncoder, packer: ConversationPacker, tokens=None):
    """The mindspore.dataset pipeline over `rows` (in that order); columns sample_id + CONVERSATION_TRAIN_COLUMNS
    (the attachments as cached encoder states with `tokens`)."""
    import mindspore.dataset as ds

    workers = max(1, min(int(cfg.data.num_workers), os.cpu_count() or 1))
    data = ds.MindDataset(files, columns_list=list(TABLE_COLUMNS), sampler=ds.SubsetSampler([int(i) for i in rows]))
    stage = ConversationStage(Path(cfg.data.root), cfg, split, epoch, chat, packer, tokens)
    return data.batch(batch_size, drop_remainder=drop_remainder, per_batch_map=stage,
                      input_columns=list(TABLE_COLUMNS), output_columns=["sample_id", *CONVERSATION_TRAIN_COLUMNS],
                      num_parallel_workers=workers, python_multiprocessing=False)


class ConversationStream(ResumableStream):
    """The generative model's packed training micro-batches over the train split's conversations (of
    data.conversation_kinds, when set), resumable exactly like TrainStream (mindvl/data/reading/stream.py);
    `columns`: CONVERSATION_TRAIN_COLUMNS. `left_out`: row -> why, for the conversations that cannot be
    packed. With `tokens` (EncoderTokens filled with conversation_inputs) the attachments are cached states."""

    columns = CONVERSATION_TRAIN_COLUMNS

    def __init__(self, cfg: Config, image_tokens: int, audio_tokens: int, shard_id: Optional[int] = None,
                 num_shards: Optional[int] = None, state: Optional[Dict] = None, tokens=None) -> None:
        _, self.files, count = conversation_files(cfg, "train")
        self.tokens = tokens
        self.chat = recipe_chat(cfg, image_tokens, audio_tokens)
        self.sizes = sizes = self.measure(cfg)  # every conversation rendered once
        rows = conversation_rows(cfg, "train")
        kinds = list(cfg.data.conversation_kinds)
        usable = sizes.usable(rows, kinds)
        if not len(usable):
            raise ConfigError(f"data.conversation_kinds: {cfg.data.root} has no trainable conversation of the kinds "
                              f"{kinds} (it has {sorted(set(sizes.kinds.tolist()))}); change the kinds or the data")
        self.left_out = {int(r): sizes.refused[r] for r in rows
                         if sizes.refused[r] and (not kinds or sizes.kinds[r] in kinds)}
        super().__init__(cfg, usable, count, "conversations", shard_id, num_shards)
        self.packer = self.make_packer(conversation_packer(cfg.data, self.micro_batch_size, sizes, usable, image_tokens,
                                                           audio_tokens, self.chat.pad_id))
        if state is not None:
            self.load_state(state)

    def measure(self, cfg: Config) -> ConversationSizes:
        return conversation_sizes(cfg, "train", self.chat)

    def make_packer(self, packer: ConversationPacker) -> ConversationPacker:
        """The packer batches take (the calibrated one; a native model's wraps its buckets)."""
        return packer

    def _pipeline(self, rows: np.ndarray, epoch: int):
        return conversation_pipeline(self.cfg, "train", self.files, rows, epoch, self.micro_batch_size, True,
                                     self.chat, self.packer, self.tokens)


def create_conversation_dataset(cfg: Config, split: str, image_tokens: int, audio_tokens: int,
                                batch_size: Optional[int] = None, epoch: int = 0, shuffle: Optional[bool] = None):
    """One epoch of packed conversation batches over `split` (validation, test, or a look at train):
    sample_id + CONVERSATION_TRAIN_COLUMNS, every usable conversation once (no remainder dropped)."""
    chat = recipe_chat(cfg, image_tokens, audio_tokens)
    _, files, _ = conversation_files(cfg, split)
    sizes = conversation_sizes(cfg, split, chat)
    usable = sizes.usable(conversation_rows(cfg, split))
    batch_size = int(batch_size or cfg.data.batch_size)
    shuffle = split == "train" if shuffle is None else bool(shuffle)
    rows = usable[epoch_order(len(usable), cfg.data.seed, epoch, shuffle)]
    packer = conversation_packer(cfg.data, batch_size, sizes, usable, image_tokens, audio_tokens, chat.pad_id)
    return conversation_pipeline(cfg, split, files, rows, epoch, batch_size, False, chat, packer)
