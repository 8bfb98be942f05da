"""The Trainer: wires config, data, model, objectives and optimizer into a compiled training loop."""
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import mindspore as ms
import numpy as np
from tensorboardX import SummaryWriter
from tqdm import tqdm

from mindvl.cells import TokenInputModel, create_model
from mindvl.config import Config, ConfigError
from mindvl.data import load_meta, load_tokenizer
from mindvl.data.loader import TrainStream, split_inputs
from mindvl.data.packing import PACKED_STREAMS, PackingLog
from mindvl.pretrained.bind import bind_pretrained, load_pretrained
from mindvl.pretrained.tokens import token_cache
from mindvl.train.checkpoint import (CheckpointError, STATE_FILE, latest_checkpoint, load_model_weights,
                                     load_optimizer_state, save_checkpoint)
from mindvl.train.losses import LOSS_NAMES, MultimodalLoss
from mindvl.train.optim import create_optimizer
from mindvl.train.step import TrainStep

CONFIG_FILE = "config.json"
logger = logging.getLogger("mindvl.train")


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
    start_step: int = 0  # > 0 when the run resumed from a checkpoint
    packing: Dict[str, object] = field(default_factory=dict)  # per stream: fill statistics over the whole run
    trainable_parameters: int = 0
    token_cache_seconds: float = 0.0  # filling model.pretrained.cache before the first step (0: no cache)


def bind_data(cfg: Config, vocab: int, answers: int) -> Config:
    """Set model.text.vocab_size and model.num_answers from the data set (0 in a recipe means exactly
    this); a recipe value that disagrees with the data is an error, not a silent resize."""
    _bind(cfg, cfg.model.text, "vocab_size", "model.text.vocab_size", vocab, "tokens in its tokenizer")
    _bind(cfg, cfg.model, "num_answers", "model.num_answers", answers, "answers")
    return cfg


def _bind(cfg: Config, section, name: str, key: str, value: int, what: str) -> None:
    if getattr(section, name) not in (0, value):
        raise ConfigError(f"{key}: {getattr(section, name)} does not match the data in {cfg.data.root} "
                          f"({value} {what}); set it to 0 to follow the data")
    setattr(section, name, value)


class Trainer:
    """`resume`: a checkpoint folder, a run folder (its latest checkpoint) or "auto" (the latest in
    train.output_dir, or a fresh start when there is none). Model, optimizer, step and the data
    position are restored, so the run continues with exactly the batches it would have seen."""

    def __init__(self, cfg: Config, progress: bool = True, resume: Optional[str] = None):
        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_seed(cfg.train.seed)
        tokenizer = load_tokenizer(cfg.data.root)
        self.cfg = bind_pretrained(bind_data(cfg, tokenizer.vocab_size, len(load_meta(cfg.data.root)["answers"])))
        self.progress = progress
        self.output_dir = Path(cfg.train.output_dir)
        self.model = create_model(cfg.model, cfg.preprocess)
        load_pretrained(self.model, cfg)  # before the optimizer: frozen encoder weights are not its business
        self.tokens = token_cache(cfg, self.model)  # frozen encoders' cached states, or None: they run every step
        self.stream = TrainStream(cfg, tokens=self.tokens)
        self.steps_per_epoch = self.stream.steps_per_epoch
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.optimizer = create_optimizer(self.model, cfg.train, self.total_steps)
        network = self.model
        self.token_cache_seconds = 0.0
        if self.tokens is not None:
            start = time.perf_counter()
            self.tokens.fill(self.model, *split_inputs(cfg, "train"), log=tqdm.write if progress else logger.info,
                             progress=progress)
            self.token_cache_seconds = round(time.perf_counter() - start, 1)
            network = TokenInputModel(self.model)
        self.loss_net = MultimodalLoss(network, cfg.train.loss_weights, tokenizer.pad_id)
        self.train_step = TrainStep(self.loss_net, self.optimizer, cfg.train.grad_clip)
        self.start_step = 0
        checkpoint = self._resume_point(resume)
        if checkpoint is not None:
            self._restore(checkpoint)

    def _resume_point(self, resume: Optional[str]) -> Optional[Path]:
        if not resume:
            return None
        if resume == "auto":
            return latest_checkpoint(self.output_dir / "checkpoints")
        path = Path(resume)
        found = path if (path / STATE_FILE).is_file() else (
            latest_checkpoint(path) or latest_checkpoint(path / "checkpoints"))
        if found is None:
            raise CheckpointError(f"--resume {resume}: no checkpoint there; pass a step_* folder, a run folder "
                                  f"or 'auto'")
        return found

    def _restore(self, checkpoint: Path) -> None:
        state = load_model_weights(self.model, checkpoint)
        load_optimizer_state(self.model, self.optimizer, checkpoint)
        if "data" not in state:
            raise CheckpointError(f"{checkpoint}: its train state has no data position, so the run cannot "
                                  f"continue on the same samples; start a fresh run")
        self.stream.load_state(state["data"])
        self.start_step = int(state["step"])
        if self.start_step >= self.total_steps:
            raise CheckpointError(f"{checkpoint}: already at step {self.start_step} of {self.total_steps}; "
                                  f"raise train.max_steps or train.epochs to continue")

    def _batches(self):
        """(step, sample ids, batch) from start_step to total_steps."""
        step = self.start_step
        stream = iter(self.stream)
        try:
            for sample_ids, batch in stream:
                yield step, sample_ids, batch
                step += 1
                if step == self.total_steps:  # stop before the stream reads a batch no step will use
                    return
        finally:
            stream.close()

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
        bar = tqdm(total=self.total_steps, initial=self.start_step, desc="train", unit="step",
                   disable=not self.progress)
        train_start = time.perf_counter()
        checkpoint = None
        packing = self.cfg.data.packing
        run_packing, window_packing = PackingLog(), PackingLog()
        self._log(bar, self.stream.packer.describe(["fusion"] if self.tokens is not None else None))
        for step, _, batch in self._batches():
            start = time.perf_counter()
            loss, parts = self.train_step(*batch)
            values = np.concatenate([[loss.asnumpy()], parts.asnumpy()])
            segments = {column: batch[self.stream.columns.index(column)].asnumpy()
                        for column, _, _ in PACKED_STREAMS.values() if column in self.stream.columns}
            run_packing.add(segments, batch_size)
            window_packing.add(segments, batch_size)
            if (step + 1) % packing.log_every == 0:
                self._log_packing(writer, bar, window_packing, step + 1)
                window_packing.reset()
            if step == self.start_step:
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
                done = step - self.start_step
                rate = done * batch_size / elapsed if done else 0.0
                bar.set_postfix(loss=f"{losses['loss']:.3f}", samples_s=f"{rate:.0f}")
                for name, value in losses.items():
                    writer.add_scalar(f"train/{name}", value, step + 1)
                writer.add_scalar("train/samples_per_second", rate, step + 1)
            if (step + 1) % self.cfg.train.checkpoint_every == 0 or step + 1 == self.total_steps:
                checkpoint = save_checkpoint(self.output_dir / "checkpoints", step + 1, self.model,
                                             self.optimizer, {"samples": (step + 1) * batch_size,
                                                              "losses": losses, "data": self.stream.state()})
        bar.close()
        writer.close()
        train_seconds = time.perf_counter() - train_start
        later_steps = max(self.total_steps - self.start_step - 1, 1)
        return TrainResult(
            output_dir=str(self.output_dir), checkpoint=str(checkpoint), steps=self.total_steps,
            samples=self.total_steps * batch_size, compile_seconds=round(compile_seconds, 2),
            train_seconds=round(train_seconds, 2),
            samples_per_second=round(later_steps * batch_size / max(train_seconds, 1e-9), 1),
            first_losses=first_losses, final_losses=losses, nonfinite_steps=nonfinite,
            start_step=self.start_step, packing=run_packing.summary(),
            trainable_parameters=sum(int(p.size) for p in self.model.trainable_params()),
            token_cache_seconds=self.token_cache_seconds)

    def _log_packing(self, writer, bar, packing: PackingLog, step: int) -> None:
        """Packing is never silently off: each stream's fill and bucket use go to the log and TensorBoard."""
        for name, summary in packing.summary().items():
            writer.add_scalar(f"data/{name}_fill", summary["fill"], step)
            writer.add_scalar(f"data/{name}_samples_per_row", summary["samples_per_row"], step)
        self._log(bar, f"step {step}: {packing.describe()}")

    def _log(self, bar, message: str) -> None:
        if self.progress:
            bar.write(message)
        else:
            logger.info(message)


def train(cfg: Config, progress: bool = True, resume: Optional[str] = None) -> TrainResult:
    """Python API: train `cfg` and return the result; the run folder holds config, checkpoints, logs.
    `resume`: see `Trainer`."""
    result = Trainer(cfg, progress, resume).fit()
    (Path(result.output_dir) / "train_result.json").write_text(json.dumps(asdict(result), indent=2))
    return result


__all__ = ["Trainer", "TrainResult", "train", "bind_data"]
