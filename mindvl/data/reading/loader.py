"""Reading a built data root with mindspore.dataset: per-rank shards, per-modality workers, packing, resume.

Each row of `<split>.mindrecord` (sample id, image bytes, image / question / caption / answer ids)
becomes one example: the image decoded (and augmented in training) by Pillow, the question and caption
tokenised, a spoken version of the question as a padded log-mel (librosa), the answer as a class id and
as LM tokens, and two flags saying which question modality the model sees. Everything goes through
`mindvl.preprocess`, the same code the server and the device use.

Pipeline: MindDataset (this rank's rows, in the order below) -> batch, whose workers decode and augment
images -> a map whose workers build the audio columns -> a map whose workers build the text columns ->
(training) a map that packs the batch's texts, clips and fusion sequences (mindvl/data/reading/packing.py).
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

import os
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from mindvl.config import Config
from mindvl.data.reading.order import data_parallel_context, epoch_order
from mindvl.data.reading.packing import FUSION_COLUMNS, PACK_COLUMNS, Packer, SampleSizes
from mindvl.data.reading.splits import open_split, split_rows
from mindvl.data.reading.stages import (MODALITIES, TOKEN_TEXT_OUTPUTS, AudioStage, ImageStage, PackStage, Tables,
                                        TextStage, as_bytes, voices_of)

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


def sample_sizes(cfg: Config, split: str = "train") -> SampleSizes:
    """Every example's question and caption token counts and its question's clip frame counts, read from
    the data root without decoding any image or computing any mel: what sizes the packer's buckets."""
    from mindvl.data import records

    root, files, _ = open_split(cfg, split)
    voices = voices_of(split)
    tables = Tables(root, cfg.preprocess, voices)
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


def pipeline(cfg: Config, split: str, files: List[str], rows: np.ndarray, epoch: int, modality: str,
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
                      per_batch_map=ImageStage(root, cfg, split, epoch, tokens),
                      input_columns=["image", "sample_id"], output_columns=[image, "sample_id"], **threads)
    data = data.map(AudioStage(root, cfg, split, epoch, tokens), input_columns=["sample_id", "question_id"],
                    output_columns=["sample_id", "question_id", audio, "audio_mask"], **threads)
    text = TextStage(root, cfg, split, epoch, modality, tokens)
    data = data.map(text, input_columns=["sample_id", "question_id", "caption_id", "answer_id"],
                    output_columns=["sample_id", *text.outputs], **threads)
    columns = list(COLUMNS)
    if tokens is not None:
        columns = [{"image": image, "audio_mel": audio}.get(name, name) for name in columns] + list(TOKEN_TEXT_OUTPUTS)
    if packer is not None:
        pack = PackStage(packer, fusion_only=tokens is not None)
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

    root, files, _ = open_split(cfg, split)
    voices = voices_of(split)
    tables = Tables(root, cfg.preprocess, voices)
    rows = [row for path in files for row in records.read_table(path, ["image", "question_id", "caption_id"])]
    if split == "validation":
        rows = [rows[i] for i in split_rows(cfg, split)]
    images = list({as_bytes(row["image"]): None for row in rows})
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
    _, files, _ = open_split(cfg, split)
    train = split == "train"
    shuffle = train if shuffle is None else bool(shuffle)
    drop_remainder = train if drop_remainder is None else bool(drop_remainder)
    batch_size = int(batch_size or cfg.data.batch_size)
    of_split = split_rows(cfg, split)
    rows = of_split[epoch_order(len(of_split), cfg.data.seed, epoch, shuffle, shard_id, num_shards,
                                equal_shards=drop_remainder)]
    packer = Packer.from_config(cfg, batch_size, sample_sizes(cfg, "train")) if packed else None
    return pipeline(cfg, split, files, rows, epoch, question_modality, batch_size, drop_remainder, packer, tokens)

