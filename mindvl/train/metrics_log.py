"""metrics.jsonl and TensorBoard scalars of a training run (rank 0 only)."""
import json
from pathlib import Path
from typing import Dict

from tensorboardX import SummaryWriter

from mindvl.runs import METRICS_FILE


class MetricsLog:
    """metrics.jsonl (one JSON record per log window or evaluation) and TensorBoard scalars, rank 0 only.
    A resumed run first drops the records past its checkpoint, so each step is logged once."""

    def __init__(self, output_dir: Path, start_step: int, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.path = output_dir / METRICS_FILE
        kept = [line for line in (self.path.read_text().splitlines() if self.path.is_file() else [])
                if line.strip() and json.loads(line).get("step", 0) <= start_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.file = open(self.path, "a")
        self.tensorboard = SummaryWriter(str(output_dir / "tb"), purge_step=start_step + 1 if start_step else None)

    def write(self, record: Dict[str, object]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        prefix = "val" if record.get("split") == "validation" else "train"
        for key, value in record.items():
            if isinstance(value, dict):
                for name, item in value.items():
                    self.scalar(f"{key}/{name}", item, record["step"])
            elif isinstance(value, (int, float)) and key != "step":
                self.scalar(f"{prefix}/{key}", value, record["step"])

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.enabled:
            self.tensorboard.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.tensorboard.close()
