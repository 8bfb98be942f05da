"""Training: objectives, optimizer, compiled step, checkpoints and the Trainer."""
from mindvl.train.trainer import Trainer, TrainResult, train

__all__ = ["Trainer", "TrainResult", "train"]
