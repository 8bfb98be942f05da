"""The Trainer: runs the compiled loop over what mindvl.train.wiring builds from config and model, with its
logs, validation, checkpoints and resume.

Python API (the CLI's `mindvl train` does the same):

    args = TrainingArguments.from_yaml("mindvl/configs/tiny.yaml", ["train.max_steps=100"])
    model = create_model(args.config)
    result = Trainer(model, args).train()
"""
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn

from mindvl.config import Config, recipes_writing
from mindvl.data.reading.packing import PACKED_STREAMS, PackingLog
from mindvl.errors import CheckpointError
from mindvl.model_factory import bind_config, create_model
from mindvl.pretrained.bind import check_base
from mindvl.progress import log_line, progress_bar
from mindvl.runs import (CHECKPOINTS, CONFIG_FILE, STATE_FILE, load_model_weights, parameter_paths, read_state,
                         read_weights, resolve_checkpoint)
from mindvl.train.arguments import TrainingArguments
from mindvl.train.checkpoint import (check_same_model, find_resumable, load_optimizer_state, mark_best, save_checkpoint,
                                     verify_checkpoint)
from mindvl.train.distill import DistillationLoss
from mindvl.train.distributed import init_data_parallel
from mindvl.train.losses import LOSS_NAMES
from mindvl.train.metrics_log import MetricsLog
from mindvl.train.result import TrainResult
from mindvl.train.wiring import build_training

BEST_METRIC = "val_vqa"  # mean validation VQA accuracy over text and spoken questions (typed only: a native VLM)
logger = logging.getLogger("mindvl.train")


class Trainer:
    """Trains `model` (from `create_model(args.config)`) as `args` says; see TrainingArguments. A generative
    recipe's MultimodalLM trains on the conversation tables (ConversationStream, GenerativeLoss), the
    classifier on the example tables.

    Model, optimizer, loss scale, learned loss weights, step and data position are restored on resume,
    so the run continues with exactly the batches it would have seen."""

    def __init__(self, model: nn.Cell, args: TrainingArguments):
        self.cfg, self.model, self.progress = bind_config(args.config), model, args.progress
        self.rank, self.world = init_data_parallel()  # before the wiring: its lines go out on rank 0 only
        self.output_dir = Path(self.cfg.train.output_dir)
        self.generative = self.cfg.model.generative
        self.parts = build_training(self.cfg, model, log=self._write, warn=self._warn, progress=self.progress)
        self.start_step = 0
        self.best: Dict[str, object] = {}
        self.evaluator = None  # the generative model's validation generator, built at the first validation
        resume_point = self._resume_point(args.resume)
        if resume_point is not None:
            self._restore(*resume_point)
        elif self.cfg.train.init_from:
            self._initialise(self.cfg.train.init_from)

    def __getattr__(self, name: str):
        """The wired parts (TrainingParts: stream, loss_net, optimizer, train_step, ...) read as the trainer's
        own, as the loop and its callers use them: trainer.stream, trainer.train_step."""
        if name == "parts":  # not set yet (a failed __init__, copy): no recursion
            raise AttributeError(name)
        return getattr(self.parts, name)

    # ------------------------------------------------------------------ setup and resume

    @property
    def learned_weights(self) -> bool:
        """The objectives' weights are learned (train.loss_weighting: uncertainty; the classifier's only)."""
        return self.loss_net.weighting is not None and self.loss_net.weighting.learned

    def _extra_state(self) -> Dict[str, np.ndarray]:
        """What the checkpoint keeps besides model and optimizer moments."""
        extra = {"loss_scale": self.scaler.scale_value.asnumpy()}
        if hasattr(self.scaler, "counter"):
            extra["loss_scale_counter"] = self.scaler.counter.asnumpy()
        if self.learned_weights:
            extra["loss_log_variance"] = self.loss_net.weighting.log_variance.asnumpy()
        if isinstance(self.loss_net, DistillationLoss):
            extra.update(self.loss_net.projection_state())
        return extra

    def _resume_point(self, resume: Optional[str]) -> Optional[Tuple[Path, Dict]]:
        """(checkpoint, its train state), each checkpoint's files hashed once: find_resumable verifies
        the one it returns, an explicit step_* folder is verified here."""
        if not resume:
            return None
        path = Path(resume)
        if resume != "auto" and (path / STATE_FILE).is_file():
            self._refuse_rollback(path)
            return path, verify_checkpoint(path)
        if resume == "auto":
            found = find_resumable(self.output_dir / CHECKPOINTS, warn=self._warn)
        else:
            found = find_resumable(path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path, warn=self._warn)
            if found is None:
                raise CheckpointError(f"--resume {resume}: no checkpoint there; pass a step_* folder, a run folder "
                                      f"or 'auto'")
        return (found, read_state(found)) if found is not None else None

    def _refuse_rollback(self, checkpoint: Path) -> None:
        """Going back to an older checkpoint inside this run's own folder would leave the newer ones of
        the abandoned attempt for a later `--resume auto` to pick up: refuse, naming them."""
        own = self.output_dir / CHECKPOINTS
        if checkpoint.resolve().parent != own.resolve():
            return
        newer = sorted(p.name for p in own.glob("step_*") if p.name > checkpoint.name)
        if newer:
            raise CheckpointError(f"--resume {checkpoint}: {own} also holds the newer {', '.join(newer)}; a later "
                                  f"--resume auto would return to them. Move them out of {own}, or resume into "
                                  f"another train.output_dir")

    def _initialise(self, source: str) -> None:
        """train.init_from: every tensor of `source`'s weights the model has (same name and shape) copied in;
        its frozen base, if it records one, must be this run's."""
        if not Path(source).exists():
            stages = recipes_writing(source)
            first = (f"mindvl train --config {stages[0]} --set data.root={self.cfg.data.root}" if stages else
                     "the recipe whose train.output_dir it is")
            raise CheckpointError(f"train.init_from: {source} does not exist; train the run it names first "
                                  f"({first}), point train.init_from at such a run, or set train.init_from='' "
                                  f"to start from scratch")
        weights = resolve_checkpoint(Path(source))
        state = read_state(weights.parent) if (weights.parent / STATE_FILE).is_file() else {}
        if state.get("base"):
            check_base(state["base"], self.cfg.model)
        params = parameter_paths(self.model)
        taken = {name: value for name, value in read_weights(weights).items() if name in params}
        for name, value in taken.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise CheckpointError(f"train.init_from: {weights} holds {name} of shape {value.shape}, this model's "
                                      f"is {tuple(params[name].shape)}; start from a run of the same model")
            params[name].set_data(ms.Tensor(value))
        if not taken:
            raise CheckpointError(f"train.init_from: {weights} holds none of this model's weights")
        self._write(f"initialised {len(taken)} of {len(params)} tensors from {weights}")

    def _restore(self, checkpoint: Path, state: Dict) -> None:
        check_same_model(checkpoint, state, self.cfg.to_dict()["model"])
        if state.get("base"):  # the frozen weights it was trained on are the ones this run loaded
            check_base(state["base"], self.cfg.model)
        if "data" not in state:
            raise CheckpointError(f"{checkpoint}: its train state has no data position, so the run cannot "
                                  f"continue on the same samples; start a fresh run")
        load_model_weights(self.model, checkpoint)
        extra = load_optimizer_state(self.model, self.optimizer, checkpoint)
        self.scaler.scale_value.set_data(ms.Tensor(extra.get("loss_scale", np.float32(1.0))))
        if hasattr(self.scaler, "counter") and "loss_scale_counter" in extra:
            self.scaler.counter.set_data(ms.Tensor(extra["loss_scale_counter"]))
        if self.learned_weights and "loss_log_variance" in extra:
            self.loss_net.weighting.log_variance.set_data(ms.Tensor(extra["loss_log_variance"]))
        if isinstance(self.loss_net, DistillationLoss):
            self.loss_net.load_projection_state(extra)
        self.stream.load_state(state["data"])
        self.start_step = int(state["step"])
        self.best = state.get("best", {})
        if self.start_step >= self.total_steps:
            raise CheckpointError(f"{checkpoint}: already at step {self.start_step} of {self.total_steps}; "
                                  f"raise train.max_steps or train.epochs to continue")
        self._write(f"resumed from {checkpoint} at step {self.start_step} "
                    f"({state['data'].get('samples', '?')} samples consumed)")

    # ------------------------------------------------------------------ the loop

    def _steps(self):
        """(step, micro-batches of that optimizer step) from start_step to total_steps."""
        step, micro = self.start_step, []
        stream = iter(self.stream)
        try:
            for _, batch in stream:
                micro.append(batch)
                if len(micro) < self.stream.accumulation:
                    continue
                yield step, micro
                step, micro = step + 1, []
                if step == self.total_steps:  # stop before the stream reads a batch no step will use
                    return
        finally:
            stream.close()

    def train(self) -> TrainResult:
        cfg = self.cfg
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            (self.output_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
        log = MetricsLog(self.output_dir, self.start_step, enabled=self.rank == 0)
        global_batch = cfg.data.batch_size
        window: List[np.ndarray] = []
        first_losses: Dict[str, float] = {}
        losses: Dict[str, float] = {}
        compile_seconds, skipped, checkpoint = 0.0, 0, None
        validation: List[Dict[str, object]] = []
        self.train_step.set_train(True)
        bar = progress_bar(total=self.total_steps, initial=self.start_step, desc="train", unit="step",
                   disable=not self.progress or self.rank != 0)
        run_packing, window_packing = PackingLog(), PackingLog()
        self._write(self.stream.packer.describe() if self.generative
                    else self.stream.packer.describe(["fusion"] if self.tokens is not None else None))
        if self.recomputed:
            self._write(f"recomputed in backward: {', '.join(self.recomputed)}")
        train_start = window_start = time.perf_counter()
        window_steps = 0
        for step, micro in self._steps():
            start = time.perf_counter()
            values = []
            for index, batch in enumerate(micro):
                loss, parts, norms, finite, scale = self.train_step(index == len(micro) - 1, *batch)
                values.append(np.concatenate([[loss.asnumpy()], parts.asnumpy()]))
                self._count_packing(batch, run_packing, window_packing)
            if step == self.start_step:
                compile_seconds = time.perf_counter() - start
                train_start = window_start = time.perf_counter()
            else:
                window_steps += 1
            if bool(finite.asnumpy()):
                window.append(np.mean(values, axis=0))
            else:
                skipped += 1
                self._warn(f"step {step + 1}: non-finite gradients (a NaN/inf in the batch or a float16 "
                           f"overflow): step skipped, weights unchanged, loss scale now {float(scale.asnumpy()):g}")
            bar.update(1)
            done = step + 1
            if done % cfg.data.packing.log_every == 0:
                self._log_packing(log, bar, window_packing, done)
                window_packing.reset()
            if window and (done % cfg.train.log_every == 0 or done == self.total_steps):
                elapsed = time.perf_counter() - window_start
                rate = window_steps * global_batch / elapsed if window_steps else 0.0
                losses = dict(zip(("loss", *self.loss_net.part_names), np.mean(window, axis=0).round(4).tolist()))
                first_losses = first_losses or losses
                record = {"step": done, **losses, "lr": float(self.lr[step]), "samples_per_second": round(rate, 1),
                          "loss_scale": float(scale.asnumpy()), "skipped_steps": skipped,
                          "grad_norm": dict(zip(self.groups, np.round(norms.asnumpy().astype(float), 5).tolist()))}
                if self.learned_weights:
                    record["loss_weight"] = dict(zip(LOSS_NAMES, self.loss_net.weighting.effective_weights().round(4)
                                                     .tolist()))
                log.write(record)
                bar.set_postfix(loss=f"{losses['loss']:.3f}", lr=f"{record['lr']:.2e}", samples_s=f"{rate:.0f}")
                window, window_steps, window_start = [], 0, time.perf_counter()
            evaluate_now = cfg.train.eval_every and (done % cfg.train.eval_every == 0 or done == self.total_steps)
            metrics = self._validate(done, log) if evaluate_now else None
            if metrics is not None:
                validation.append(metrics)
            if done % cfg.train.checkpoint_every == 0 or done == self.total_steps or metrics is not None:
                checkpoint = self._save(done, losses, metrics)
        bar.close()
        log.close()
        train_seconds = time.perf_counter() - train_start
        later_steps = max(self.total_steps - self.start_step - 1, 1)
        result = TrainResult(
            output_dir=str(self.output_dir), checkpoint=str(checkpoint), steps=self.total_steps,
            samples=self.total_steps * global_batch, compile_seconds=round(compile_seconds, 2),
            train_seconds=round(train_seconds, 2),
            samples_per_second=round(later_steps * global_batch / max(train_seconds, 1e-9), 1),
            first_losses=first_losses, final_losses=losses, skipped_steps=skipped,
            start_step=self.start_step, packing=run_packing.summary(),
            trainable_parameters=sum(int(p.size) for p in self.model.trainable_params()),
            token_cache_seconds=self.token_cache_seconds, world_size=self.world,
            loss_scale=float(self.scaler.scale_value.asnumpy()), best=self.best, validation=validation)
        if self.rank == 0:
            (self.output_dir / "train_result.json").write_text(json.dumps(asdict(result), indent=2))
        return result

    def _save(self, step: int, losses: Dict[str, float], metrics: Optional[Dict]) -> Path:
        directory = self.output_dir / CHECKPOINTS
        if metrics is not None and metrics[BEST_METRIC] > self.best.get("value", -1.0):
            self.best = {"step": step, "metric": BEST_METRIC, "value": metrics[BEST_METRIC]}
        if self.rank != 0:  # every rank holds the same weights; rank 0 writes them
            return directory / f"step_{step:08d}"
        checkpoint = save_checkpoint(directory, step, self.model, self.optimizer,
                                     {"samples": step * self.cfg.data.batch_size, "losses": losses,
                                      "data": self.stream.state(), "model_config": self.cfg.to_dict()["model"],
                                      "best": self.best, **({"validation": metrics} if metrics else {}),
                                      **({"base": self.base} if self.base else {})},
                                     extra=self._extra_state(), keep=self.cfg.train.keep_checkpoints,
                                     exclude=self.base_parameters)
        if self.best.get("step") == step:
            mark_best(directory, checkpoint, BEST_METRIC, self.best["value"])
        return checkpoint

    def _validate(self, step: int, log: MetricsLog) -> Dict[str, object]:
        """VQA accuracy on the validation split with text and with spoken questions (a generative model's:
        of its generated answers)."""
        from mindvl.eval.vqa import vqa_accuracy

        self.model.set_train(False)
        metrics: Dict[str, object] = {"step": step, "split": "validation"}
        if self.generative:  # the answers it writes, typed and spoken (the evaluator's graphs compile once)
            from mindvl.eval.generated_answers import GenerativeEvaluator

            self.evaluator = self.evaluator or GenerativeEvaluator(self.cfg, self.model)
            report = self.evaluator.evaluate("validation", captions=False, progress=False)
        modalities = [m for m, _ in self.evaluator.modalities] if self.generative else ["text", "audio"]
        for modality in modalities:
            if self.generative:
                result = report[f"vqa_{modality}"]
            else:
                result = vqa_accuracy(self.cfg, self.model, modality, progress=False, tokens=self.tokens,
                                      split="validation")
            metrics[f"vqa_{modality}"] = round(result["accuracy"], 4)
        metrics[BEST_METRIC] = round(sum(metrics[f"vqa_{m}"] for m in modalities) / len(modalities), 4)
        self.model.set_train(True)
        log.write(metrics)
        self._write(f"step {step}: validation VQA " + ", ".join(
            f"{'typed' if m == 'text' else 'spoken'} {metrics[f'vqa_{m}']:.1%}" for m in modalities))
        return metrics

    # ------------------------------------------------------------------ logging

    def _count_packing(self, batch, *logs: PackingLog) -> None:
        segments = {column: batch[self.stream.columns.index(column)].asnumpy()
                    for column, _, _ in PACKED_STREAMS.values() if column in self.stream.columns}
        for packing in logs:
            packing.add(segments, self.stream.micro_batch_size)

    def _log_packing(self, log: MetricsLog, bar, packing: PackingLog, step: int) -> None:
        """Packing is never silently off: each stream's fill and bucket use go to the log and TensorBoard."""
        for name, summary in packing.summary().items():
            log.scalar(f"data/{name}_fill", summary["fill"], step)
            log.scalar(f"data/{name}_samples_per_row", summary["samples_per_row"], step)
        self._write(f"step {step}: {packing.describe()}")

    def _write(self, message: str) -> None:
        if self.rank != 0:
            return
        if self.progress:
            log_line(message)
        else:
            logger.info(message)

    def _warn(self, message: str) -> None:
        if self.progress:
            log_line(f"warning: {message}")
        logger.warning(message)


def train(cfg: Config, progress: bool = True, resume: Optional[str] = None) -> TrainResult:
    """Train `cfg` and return the result; the run folder holds config, checkpoints and logs."""
    args = TrainingArguments(cfg, resume=resume, progress=progress)
    return Trainer(create_model(args), args).train()
