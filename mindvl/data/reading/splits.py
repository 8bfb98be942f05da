"""The splits of a data root: "train" and "test" are its tables, "validation" the train table's rows of
the images data.validation_fraction holds out (chosen by a hash of (data.seed, image_id), so all questions
of an image go together), and the checks that a root can be read with a config's preprocess settings."""
import os
import threading
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from mindvl.config import Config, PreprocessConfig
from mindvl.data.reading.order import HOLDOUT, mix
from mindvl.data.root import load_meta, require_file
from mindvl.errors import ConfigError, DataRootError

LOADER_SPLITS = ("train", "validation", "test")  # the source tables (data.source.SPLITS) and the hold-out


def check_compatible(root: Path, meta: Dict, pre: PreprocessConfig) -> None:
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


def open_split(cfg: Config, split: str) -> Tuple[Path, List[str], int]:
    """(root, table files, row count of those files) of a split, after checking the root is usable;
    "validation" reads the train table (its rows: `split_rows`)."""
    from mindvl.data import records

    if split not in LOADER_SPLITS:
        raise ValueError(f"split {split!r}: expected one of {list(LOADER_SPLITS)}")
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
        require_file(root, Path(path).name)
    meta = load_meta(root)
    check_compatible(root, meta, cfg.preprocess)
    return root, files, int(meta["counts"][table]["examples"])


_IMAGE_IDS: Dict[Tuple, np.ndarray] = {}
_IMAGE_IDS_LOCK = threading.Lock()


def image_ids_of(files: List[str]) -> np.ndarray:
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
    ranked = sorted(images.tolist(), key=lambda i: (mix(seed, i, HOLDOUT), i))
    return np.sort(np.asarray(ranked[:keep], np.int64))


def split_rows(cfg: Config, split: str) -> np.ndarray:
    """Row indices (= sample ids) of `split` in its table, ascending: "test" every test row; "train" the
    train table's rows except the held-out images' (data.validation_fraction); "validation" exactly those."""
    root, files, count = open_split(cfg, split)
    fraction = float(cfg.data.validation_fraction)
    if split == "test" or (split == "train" and fraction == 0):
        return np.arange(count)
    held = validation_images(image_ids_of(files), fraction, int(cfg.data.seed))
    if split == "validation" and len(held) == 0:
        raise ConfigError(f"split 'validation': {root} has a single training image, too few to hold one out; "
                          f"build more data or set data.validation_fraction: 0")
    in_validation = np.isin(image_ids_of(files), held)
    return np.flatnonzero(in_validation if split == "validation" else ~in_validation)
