"""TrainResult: what one `Trainer.train()` returns and `mindvl train` prints (and writes to train_result.json)."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from mindvl.runs import METRICS_FILE


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
    skipped_steps: int = 0  # steps with non-finite gradients: not applied (the loss scale was lowered)
    start_step: int = 0  # > 0 when the run resumed from a checkpoint
    packing: Dict[str, object] = field(default_factory=dict)  # per stream: fill statistics over the whole run
    trainable_parameters: int = 0
    token_cache_seconds: float = 0.0  # filling model.pretrained.cache before the first step (0: no cache)
    world_size: int = 1  # data-parallel ranks
    loss_scale: float = 1.0  # at the end
    best: Dict[str, object] = field(default_factory=dict)  # best validation checkpoint (train.eval_every)
    validation: List[Dict[str, object]] = field(default_factory=list)  # every validation evaluation

    def summary(self) -> str:
        """The end-of-run report `mindvl train` prints."""
        def losses(values):
            return ", ".join(f"{k} {v:.3f}" for k, v in values.items()) or "-"

        lines = [f"trained steps {self.start_step}..{self.steps} ({self.samples} samples) on {self.world_size} "
                 f"rank(s): {self.samples_per_second:.1f} samples/s, compile {self.compile_seconds:.1f} s, "
                 f"steps {self.train_seconds:.1f} s" + (f", encoder cache {self.token_cache_seconds:.0f} s"
                                                        if self.token_cache_seconds else ""),
                 f"loss first window: {losses(self.first_losses)}",
                 f"loss last window:  {losses(self.final_losses)}",
                 f"skipped steps (non-finite gradients): {self.skipped_steps}; final loss scale {self.loss_scale:g}; "
                 f"trainable parameters {self.trainable_parameters:,}"]
        if self.best:
            lines.append(f"best validation {self.best['metric']} {self.best['value']:.4f} at step {self.best['step']}")
        lines.append(f"checkpoint {self.checkpoint}; logs {Path(self.output_dir) / METRICS_FILE}, "
                     f"{Path(self.output_dir) / 'tb'}")
        return "\n".join(lines)
