"""The Trainer: wires config, data, model, objectives and optimizer into a compiled training loop."""
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import mindspore as ms
import numpy as np
from tensorboardX import SummaryWriter
from tqdm import tqdm

from mindvl.cells import create_model
from mindvl.config import Config, ConfigError
from mindvl.data import create_dataset, load_tokenizer
from mindvl.train.checkpoint import save_checkpoint
from mindvl.train.losses import LOSS_NAMES, MultimodalLoss
from mindvl.train.optim import create_optimizer
from mindvl.train.step import TrainStep

CONFIG_FILE = "config.json"


@dataclass
class TrainResult:
    output_dir: str
    checkpoint: str
    steps: int
    samples: int
    compile_seconds: float  # wall time of the first step, which compiles the graph
    train_seconds: float  # wall time of every later step, data loading included
    samples_per_second: float
    first_losses: Dict[str, float] = field(default_factory=dict)  # mean over the first log window
    final_losses: Dict[str, float] = field(default_factory=dict)  # mean over the last log window
    nonfinite_steps: int = 0  # steps whose loss was NaN/inf (left out of the logged means)


def bind_vocab(cfg: Config, vocab: int) -> Config:
    """Set model.text.vocab_size from the data set's tokenizer (0 in a recipe means exactly this)."""
    if cfg.model.text.vocab_size not in (0, vocab):
        raise ConfigError(f"model.text.vocab_size: {cfg.model.text.vocab_size} does not match the tokenizer "
                          f"of {cfg.data.root} ({vocab} tokens); set it to 0 to follow the data")
    cfg.model.text.vocab_size = vocab
    return cfg


class Trainer:
    def __init__(self, cfg: Config, progress: bool = True):
        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_seed(cfg.train.seed)
        tokenizer = load_tokenizer(cfg.data.root)
        self.cfg = bind_vocab(cfg, tokenizer.vocab_size)
        self.progress = progress
        self.output_dir = Path(cfg.train.output_dir)
        self.dataset = create_dataset(cfg, "train")
        self.steps_per_epoch = self.dataset.get_dataset_size()
        if self.steps_per_epoch == 0:
            raise ConfigError(f"data.batch_size: {cfg.data.batch_size} is larger than the training set in "
                              f"{cfg.data.root}; lower it or build more data")
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.model = create_model(cfg.model, cfg.preprocess)
        self.optimizer = create_optimizer(self.model, cfg.train, self.total_steps)
        self.loss_net = MultimodalLoss(self.model, cfg.train.loss_weights, tokenizer.pad_id)
        self.train_step = TrainStep(self.loss_net, self.optimizer, cfg.train.grad_clip)

    def _batches(self):
        """(step, batch) for total_steps steps; the iterator ends each epoch and is re-entered for the next."""
        epochs = -(-self.total_steps // self.steps_per_epoch)
        iterator = self.dataset.create_tuple_iterator(num_epochs=epochs)
        step = 0
        for _ in range(epochs):
            for batch in iterator:
                if step == self.total_steps:
                    return
                yield step, batch
                step += 1

    def fit(self) -> TrainResult:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / CONFIG_FILE).write_text(json.dumps(self.cfg.to_dict(), indent=2))
        writer = SummaryWriter(str(self.output_dir / "tb"))
        batch_size = self.cfg.data.batch_size
        window: List[np.ndarray] = []
        first_losses: Dict[str, float] = {}
        losses: Dict[str, float] = {}
        compile_seconds = 0.0
        nonfinite = 0
        self.train_step.set_train(True)
        bar = tqdm(total=self.total_steps, desc="train", unit="step", disable=not self.progress)
        train_start = time.perf_counter()
        checkpoint = None
        for step, batch in self._batches():
            start = time.perf_counter()
            loss, parts = self.train_step(*batch)
            values = np.concatenate([[loss.asnumpy()], parts.asnumpy()])
            if step == 0:
                compile_seconds = time.perf_counter() - start
                train_start = time.perf_counter()
            if np.all(np.isfinite(values)):
                window.append(values)
            else:
                nonfinite += 1
            bar.update(1)
            if window and ((step + 1) % self.cfg.train.log_every == 0 or step + 1 == self.total_steps):
                losses = dict(zip(("loss", *LOSS_NAMES), np.mean(window, axis=0).round(4).tolist()))
                first_losses = first_losses or losses
                window = []
                elapsed = time.perf_counter() - train_start
                rate = step * batch_size / elapsed if step else 0.0
                bar.set_postfix(loss=f"{losses['loss']:.3f}", samples_s=f"{rate:.0f}")
                for name, value in losses.items():
                    writer.add_scalar(f"train/{name}", value, step + 1)
                writer.add_scalar("train/samples_per_second", rate, step + 1)
            if (step + 1) % self.cfg.train.checkpoint_every == 0 or step + 1 == self.total_steps:
                checkpoint = save_checkpoint(self.output_dir / "checkpoints", step + 1, self.model,
                                             self.optimizer, {"samples": (step + 1) * batch_size,
                                                              "losses": losses})
        bar.close()
        writer.close()
        train_seconds = time.perf_counter() - train_start
        later_steps = max(self.total_steps - 1, 1)
        return TrainResult(
            output_dir=str(self.output_dir), checkpoint=str(checkpoint), steps=self.total_steps,
            samples=self.total_steps * batch_size, compile_seconds=round(compile_seconds, 2),
            train_seconds=round(train_seconds, 2),
            samples_per_second=round(later_steps * batch_size / max(train_seconds, 1e-9), 1),
            first_losses=first_losses, final_losses=losses, nonfinite_steps=nonfinite)


def train(cfg: Config, progress: bool = True) -> TrainResult:
    """Python API: train `cfg` and return the result; the run folder holds config, checkpoints, logs."""
    result = Trainer(cfg, progress).fit()
    (Path(result.output_dir) / "train_result.json").write_text(json.dumps(asdict(result), indent=2))
    return result


__all__ = ["Trainer", "TrainResult", "train", "bind_vocab"]
