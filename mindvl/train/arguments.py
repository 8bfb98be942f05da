"""TrainingArguments: a recipe (the whole Config) and how to run it, the Trainer's one input besides the model."""
from dataclasses import dataclass
from typing import Optional, Sequence

from mindvl.config import Config, load_config


@dataclass
class TrainingArguments:
    """A recipe (the whole Config) and how to run it. `resume`: a checkpoint folder, a run folder (its
    newest good checkpoint) or "auto" (the newest good one in train.output_dir, or a fresh start)."""

    config: Config
    resume: Optional[str] = None
    progress: bool = True

    @classmethod
    def from_yaml(cls, path: str, overrides: Sequence[str] = (), **run) -> "TrainingArguments":
        """Load a recipe (a name in mindvl/configs or a YAML path) with KEY=VALUE overrides."""
        return cls(load_config(path, overrides), **run)
