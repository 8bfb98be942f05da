"""What a built data set looks like to the recipe's packer: its sequence lengths and the fill the packer reaches on
them per bucket. Plain numbers and lists, for `mindvl plot DATA` and the quickstarts' pictures
(mindvl/plots/data.py). The packer is the recipe's (`data_lengths` picks it):

  classifier  question and caption tokens and speech clip frames, as the loader reads them, and the fill of the
              text, audio and fusion streams per row bucket (Packer.bucket_fill) over batches drawn from the split;
  generative  rendered tokens per conversation against data.packing.length, and the fill of the conversation
              rows (rows x data.packing.length) and of the label buckets (ConversationPacker.bucket_fill) over
              the first micro-batches training reads (ConversationStream: its conversations, order and packer).
"""
from typing import Any, Dict

import numpy as np

from mindvl.config import Config
from mindvl.data.reading.loader import sample_sizes
from mindvl.data.reading.packing import Packer

FILL_BATCHES = 64  # batches drawn to measure the fill (classifier: from another seed than the buckets' calibration)


def data_lengths(cfg: Config, split: str = "train", batches: int = FILL_BATCHES) -> Dict[str, Any]:
    """{"split", "batch_size", "lengths": {name: [per item]}, "limits": {name: the longest the model takes},
    "packing": {stream: [per bucket: its shape, "padded", "batches" that took it, "fill"]}} of the packer cfg's
    model trains with: the conversations' for a generative recipe, the examples' streams otherwise."""
    return (conversation_lengths if cfg.model.generative else example_lengths)(cfg, split, batches)


def example_lengths(cfg: Config, split: str = "train", batches: int = FILL_BATCHES) -> Dict[str, Any]:
    """The classifier's view: "packing" is Packer.bucket_fill of cfg's packer (its buckets calibrated on `split`,
    as training's are). Audio frames: every clip of each example's question (the loader speaks one per epoch)."""
    sizes = sample_sizes(cfg, split)
    packer = Packer.from_config(cfg, 0, sizes)
    pre = cfg.preprocess
    return {"split": split, "batch_size": packer.fusion.batch_size,
            "lengths": {"question tokens": sizes.question_tokens.tolist(),
                        "caption tokens": sizes.caption_tokens.tolist(),
                        "audio frames": np.concatenate(list(sizes.clip_frames) or [np.zeros(0, int)]).tolist()},
            "limits": {"question tokens": pre.max_text_length, "caption tokens": pre.max_text_length,
                       "audio frames": pre.max_audio_frames},
            "packing": packer.bucket_fill(sizes, batches, np.random.default_rng(cfg.data.seed + 1))}


def conversation_lengths(cfg: Config, split: str = "train", batches: int = FILL_BATCHES) -> Dict[str, Any]:
    """The generative view, of the training split only: the training stream of one process (ConversationStream:
    the conversations of data.conversation_kinds that fit a row, rendered as training renders them, and its
    packer) and its first `batches` micro-batches, in training's order from epoch 0 on. "lengths": rendered tokens
    of each of those conversations; "packing": ConversationPacker.bucket_fill of those micro-batches."""
    from mindvl.cells.multimodal_lm import modality_tokens
    from mindvl.data.reading.conversation_loader import ConversationStream

    if split != "train":
        raise ValueError(f"conversation packing is training's: split 'train', got {split!r}")
    _, _, image_tokens, _, audio_tokens = modality_tokens(cfg.model, cfg.preprocess)
    stream = ConversationStream(cfg, image_tokens, audio_tokens, shard_id=0, num_shards=1)
    drawn, epoch = [], 0
    while len(drawn) < batches:
        drawn += list(stream.epoch_rows(epoch).reshape(-1, stream.micro_batch_size))
        epoch += 1
    sizes = stream.sizes
    return {"split": split, "batch_size": stream.micro_batch_size,
            "lengths": {"conversation tokens": sizes.tokens[stream.rows].tolist()},
            "limits": {"conversation tokens": stream.packer.length},
            "packing": stream.packer.bucket_fill([(sizes.tokens[rows].tolist(), int(sizes.labels[rows].sum()))
                                                  for rows in drawn[:batches]])}
