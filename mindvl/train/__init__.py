"""Training: objectives, optimizer, precision, compiled step, checkpoints and the Trainer."""
from mindvl.train.trainer import Trainer, TrainingArguments, TrainResult, create_model, train

__all__ = ["Trainer", "TrainingArguments", "TrainResult", "create_model", "train"]
