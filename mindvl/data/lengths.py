"""What a built data set looks like to the model's input streams: its sequence lengths (question and caption
tokens, speech clip frames, as the loader reads them) and the fill the recipe's packer reaches on them per row
bucket. Plain numbers and lists, for `mindvl plot DATA` and the quickstart's pictures (mindvl/plots/data.py)."""
from typing import Any, Dict

import numpy as np

from mindvl.config import Config
from mindvl.data.loader import sample_sizes
from mindvl.data.packing import Packer

FILL_BATCHES = 64  # batches drawn to measure the fill, from another seed than the buckets' calibration


def data_lengths(cfg: Config, split: str = "train", batches: int = FILL_BATCHES) -> Dict[str, Any]:
    """{"split", "lengths": {name: [per example]}, "limits": {name: the longest the model takes}, "batch_size",
    "packing": Packer.bucket_fill of cfg's packer (its buckets calibrated on `split`, as training's are)}.
    Audio frames: every clip of each example's question (the loader speaks one of them per epoch)."""
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
