"""Order and randomness of the data, as functions of (data.seed, epoch, sample id) only, never of worker
scheduling (the scheme: mindvl/data/reading/loader.py's docstring): counter-based draws, each rank's share of an
epoch, and an optimizer step's global batch cut into ranks and micro-batches."""
from typing import Optional, Tuple

import numpy as np

from mindvl.errors import ConfigError

CLIP, MODALITY, IMAGE, AUDIO, TEXT, HOLDOUT = range(6)  # purposes of per-sample random draws


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 rounds): cheap per-sample randomness independent of workers."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h


def uniform(*values: int) -> float:
    return (mix(*values) >> 11) / float(1 << 53)


def generator(*values: int) -> np.random.Generator:
    return np.random.default_rng(mix(*values))


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
    order = generator(seed, epoch).permutation(count) if shuffle else np.arange(count)
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
