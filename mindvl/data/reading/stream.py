"""Training streams: packed micro-batches from a resumable position (epoch, optimizer steps consumed,
micro-batches of the next step consumed), the same on every rank (scheme: mindvl/data/reading/loader.py).
ResumableStream holds the order and the resume logic; TrainStream reads the classifier's examples,
mindvl.data.reading.conversation_loader.ConversationStream the generative model's conversations."""
from dataclasses import asdict, dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from mindvl.config import Config
from mindvl.data.reading.loader import TOKEN_TRAIN_COLUMNS, TRAIN_COLUMNS, pipeline, sample_sizes
from mindvl.data.reading.order import data_parallel_context, epoch_order, global_batches, micro_batch_size
from mindvl.data.reading.packing import Packer
from mindvl.data.reading.splits import open_split, split_rows
from mindvl.errors import ConfigError


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


class ResumableStream:
    """Training micro-batches forever over `rows` (a table's sample ids) from a resumable position: the
    order, the global batches and the resume logic every training stream shares (see the module docstring).

    An optimizer step takes `accumulation` consecutive micro-batches of `micro_batch_size` rows from each
    of the `num_shards` ranks: `batch_size` (data.batch_size, global) rows in all; `steps_per_epoch`
    counts optimizer steps. Iterating yields (sample_ids (micro,) numpy, tuple of mindspore Tensors in
    `columns` order) and advances `position` before each yield, so `state()` taken after a step describes
    exactly what was consumed. A subclass sets `columns` and builds one epoch's pipeline (`_pipeline`).
    """

    columns: Tuple[str, ...] = ()

    def __init__(self, cfg: Config, rows: np.ndarray, count: int, what: str, shard_id: Optional[int] = None,
                 num_shards: Optional[int] = None) -> None:
        self.cfg = cfg
        self.shard_id, self.num_shards = data_parallel_context(shard_id, num_shards)
        self.rows, self.count = rows, count  # the rows trained on; `count`: the table's rows (order key)
        self.batch_size = int(cfg.data.batch_size)
        self.accumulation = int(cfg.train.grad_accumulation)
        self.micro_batch_size = micro_batch_size(self.batch_size, self.num_shards, self.accumulation)
        self.steps_per_epoch = len(self.rows) // self.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"data.batch_size: the global batch of {self.batch_size} is more than the "
                              f"{len(self.rows)} training {what} in {cfg.data.root}; lower it or build more data")
        self.position = DataPosition()

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

    def _pipeline(self, rows: np.ndarray, epoch: int):
        """The mindspore.dataset pipeline over `rows` (in that order) of `epoch`, with a sample_id column
        and `columns`."""
        raise NotImplementedError

    def _epoch(self, epoch: int, start: int):
        """The pipeline over this rank's rows of `epoch` from its micro-batch `start` on."""
        return self._pipeline(self.epoch_rows(epoch).reshape(-1)[start * self.micro_batch_size:], epoch)

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


class TrainStream(ResumableStream):
    """The classifier's packed training micro-batches (mindvl/data/reading/loader.py): `columns` are TRAIN_COLUMNS,
    or TOKEN_TRAIN_COLUMNS when `tokens` (mindvl.pretrained.tokens.EncoderTokens, filled) hands on cached
    encoder states. The packer is built for the micro-batch."""

    def __init__(self, cfg: Config, shard_id: Optional[int] = None, num_shards: Optional[int] = None,
                 state: Optional[Dict] = None, tokens=None) -> None:
        _, self.files, count = open_split(cfg, "train")
        # training rows: the held-out validation images excluded
        super().__init__(cfg, split_rows(cfg, "train"), count, "examples", shard_id, num_shards)
        self.tokens = tokens
        self.columns = TOKEN_TRAIN_COLUMNS if tokens is not None else TRAIN_COLUMNS
        self.packer = Packer.from_config(cfg, self.micro_batch_size, sample_sizes(cfg, "train"))
        if state is not None:
            self.load_state(state)

    def _pipeline(self, rows: np.ndarray, epoch: int):
        return pipeline(self.cfg, "train", self.files, rows, epoch, "mix", self.micro_batch_size, True,
                        self.packer, self.tokens)
