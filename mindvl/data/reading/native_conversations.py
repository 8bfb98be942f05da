"""Reading a built root's conversation tables for a native-resolution VLM (model.native: Qwen2-VL, Qwen2.5-VL).

The same tables, order, resumption and sharding as the generative model's (conversation_loader.py); what changes is
what a conversation becomes: its image cut at its own resolution (mindvl.preprocess.native_resolution, no
augmentation: a crop would change its token count, measured beforehand), rendered with the checkpoint's chat
template and as many vision tokens as its grid makes, and a batch packed by NativeConversationPacker (M-RoPE
positions, the images packed on one vision sequence). The sizes pass reads each image's header only (its size
decides its tokens). A model that hears (model.native.audio) takes each conversation's clip as the generative
model does (ConversationStage.heard: a spoken question's drawn clip or its recording, a log-mel or the audio
encoder's cached states), model.projector.audio_tokens slots each; one that does not leaves a conversation with a
spoken question or a recording out, counted and named: train on data.conversation_kinds without them.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import List, Sequence

import numpy as np

from mindvl import preprocess as P
from mindvl.chat import AUDIO_SLOT, IMAGE_SLOT, ChatEncoder, conversation_turns, placeholder_count
from mindvl.config import Config
from mindvl.data import records
from mindvl.data.reading.conversation_loader import (TABLE_COLUMNS, ConversationSizes, ConversationStage,
                                                     ConversationStream, turns_json, conversation_files)
from mindvl.data.reading.conversation_packing import CONVERSATION_COLUMNS, ConversationPacker
from mindvl.data.reading.native_packing import NativeConversationPacker
from mindvl.engine.vision_layout import tower_packing
from mindvl.preprocess.native_resolution import IMAGE, PatchConfig, image_patches, smart_resize

NO_AUDIO = ("this native-resolution VLM reads no audio (model.native.audio is false); leave spoken conversations out "
            "(data.conversation_kinds)")
SPEECH_COLUMNS = ("mel", "frame_mask")


def audio_tokens(cfg: Config) -> int:
    """The slots one clip takes in a native recipe's conversations: 0 when the model does not hear."""
    if not cfg.model.native.audio:
        return 0
    from mindvl.cells.multimodal_lm import audio_pooling

    return audio_pooling(cfg.model, cfg.preprocess)[1]


def slot_sizes(turns, image_sizes: Sequence[int], clip_tokens: int) -> List[int]:
    """Each placeholder's token count in the order the turns hold them (ChatEncoder.render's `sizes`): the images'
    in turn, clip_tokens for a clip."""
    images = iter(image_sizes)
    return [next(images) if part == IMAGE_SLOT else clip_tokens
            for turn in turns for part in turn.parts if part in (IMAGE_SLOT, AUDIO_SLOT)]


def patch_config(cfg: Config) -> PatchConfig:
    return PatchConfig(**cfg.model.native.patches())


def image_tokens(data: bytes, config: PatchConfig, name: str) -> int:
    """The merged tokens an encoded image takes, from its header (smart_resize of its size)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as picture:
        height, width = smart_resize(picture.height, picture.width, config, name)
    return height * width // config.factor ** 2


def native_conversation_sizes(cfg: Config, split: str, chat: ChatEncoder) -> ConversationSizes:
    """Every conversation of `split` rendered as training renders it, each image's tokens from its header."""
    _, files, _ = conversation_files(cfg, split)
    config, length, clip_tokens = patch_config(cfg), int(cfg.data.packing.length), audio_tokens(cfg)
    tokens, labels, refused, kinds = [], [], [], []
    for path in files:
        for row in records.read_table(path, ["conversation", "turns", "kind", "image", "question_id", "pcm"]):
            kinds.append(str(row["kind"]))
            name = f"conversation {row['conversation']}"
            turns = conversation_turns(turns_json(row["turns"]))
            images = records.images_of(row["image"])
            try:
                clips = placeholder_count(turns, AUDIO_SLOT)
                if not clip_tokens and (int(row["question_id"]) >= 0 or records.as_bytes(row["pcm"]) or clips):
                    raise P.InputError(f"{name}: {NO_AUDIO}")
                sizes = [image_tokens(image, config, f"{name} image {i}") for i, image in enumerate(images)]
                rendered = chat.render(turns, len(images), clips, max_length=length, name=name,
                                       sizes=slot_sizes(turns, sizes, clip_tokens))
            except (P.InputError, OSError) as exc:
                tokens.append(0), labels.append(0), refused.append(str(exc))
                continue
            tokens.append(len(rendered)), labels.append(int(rendered.learn[1:].sum())), refused.append("")
    return ConversationSizes(np.asarray(tokens), np.asarray(labels), refused, np.asarray(kinds))


def native_train_columns(cfg: Config) -> tuple:
    """What NativeVLM's loss takes, in order: the packed conversations' columns, the clips' (a model that hears),
    then the tower's inputs."""
    speech = SPEECH_COLUMNS if cfg.model.native.audio else ()
    return CONVERSATION_COLUMNS + speech + tower_packing(cfg.model.native).names


class NativeConversationStage(ConversationStage):
    """Batch op: conversation rows -> sample ids and native_train_columns; with `tokens`, the audio encoder's
    cached states in the mel column."""

    def __init__(self, root, cfg: Config, split: str, epoch: int, chat: ChatEncoder, packer: NativeConversationPacker,
                 tokens=None):
        super().__init__(root, cfg, split, epoch, chat, packer, tokens)
        self.config = patch_config(cfg)

    def __call__(self, sample_ids, turns, images, question_ids, pcms, batch_info=None):
        rendered, attachments, mels, masks = [], [], [], []
        for sample_id, text, packed, question_id, pcm in zip(sample_ids, turns, images, question_ids, pcms):
            sample_id, name = int(sample_id), f"{self.split} conversation {int(sample_id)}"
            items = [(IMAGE, *image_patches(P.open_image(image, f"{name} image {i}"), self.config, name), 1.0)
                     for i, image in enumerate(records.images_of(packed))]
            conversation = conversation_turns(turns_json(text))
            clips = placeholder_count(conversation, AUDIO_SLOT)
            if self.packer.audio_tokens:  # the model hears
                mel, mask = self.heard(int(question_id), records.as_bytes(pcm), sample_id)
                mels.append(mel), masks.append(mask)
            sizes = [int(np.prod(grid)) // self.config.merge_size ** 2 for _, _, grid, _ in items]
            rendered.append(self.chat.render(conversation, len(items), clips, max_length=self.packer.length, name=name,
                                             sizes=slot_sizes(conversation, sizes, self.packer.audio_tokens)))
            attachments.append(items)
        packed, vision = self.packer(rendered, attachments)
        speech = (np.stack(mels), np.stack(masks)) if mels else ()
        return (np.asarray(sample_ids), *packed.arrays, *speech, *vision)


def native_pipeline(cfg: Config, split: str, files: List[str], rows: np.ndarray, epoch: int, batch_size: int,
                    drop_remainder: bool, chat: ChatEncoder, packer: NativeConversationPacker, tokens=None):
    """The mindspore.dataset pipeline over `rows` (in that order); columns sample_id + native_train_columns (the
    clips as cached audio states with `tokens`)."""
    import mindspore.dataset as ds

    workers = max(1, min(int(cfg.data.num_workers), os.cpu_count() or 1))
    data = ds.MindDataset(files, columns_list=list(TABLE_COLUMNS), sampler=ds.SubsetSampler([int(i) for i in rows]))
    stage = NativeConversationStage(Path(cfg.data.root), cfg, split, epoch, chat, packer, tokens)
    return data.batch(batch_size, drop_remainder=drop_remainder, per_batch_map=stage,
                      input_columns=list(TABLE_COLUMNS), output_columns=["sample_id", *native_train_columns(cfg)],
                      num_parallel_workers=workers, python_multiprocessing=False)


class NativeConversationStream(ConversationStream):
    """ConversationStream for a native-resolution VLM: its sizes, packer and pipeline; `columns`:
    native_train_columns."""

    def __init__(self, cfg: Config, shard_id=None, num_shards=None, state=None, tokens=None) -> None:
        super().__init__(cfg, 0, audio_tokens(cfg), shard_id, num_shards, state, tokens)
        self.columns = native_train_columns(cfg)

    def measure(self, cfg: Config) -> ConversationSizes:
        return native_conversation_sizes(cfg, "train", self.chat)

    def make_packer(self, packer: ConversationPacker) -> NativeConversationPacker:
        native = self.cfg.model.native
        return NativeConversationPacker(packer.length, packer.row_buckets, packer.label_buckets, native.vision_bucket,
                                        tower_packing(native), bool(self.cfg.model.decoder.mrope_section), packer.pad_id,
                                        packer.audio_tokens)

    def _pipeline(self, rows: np.ndarray, epoch: int):
        return native_pipeline(self.cfg, "train", self.files, rows, epoch, self.micro_batch_size, True, self.chat,
                               self.packer, self.tokens)
