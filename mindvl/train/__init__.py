"""Training: objectives, optimizer, precision, compiled step, checkpoints and the Trainer."""
from mindvl.model_factory import create_model
from mindvl.train.arguments import TrainingArguments
from mindvl.train.result import TrainResult
from mindvl.train.trainer import Trainer, train

__all__ = ["Trainer", "TrainingArguments", "TrainResult", "create_model", "train"]
