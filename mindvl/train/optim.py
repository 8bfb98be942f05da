"""Optimizer factory: AdamWeightDecay with decay only on matrices (not biases, norms or scales)."""
from mindspore import Tensor, nn

from mindvl.config import TrainConfig
from mindvl.train.schedule import warmup_cosine

NO_DECAY_MARKERS = ("bias", "beta", "gamma", "norm", "logit_scale", "embedding", "cls_token", "pos_")


def uses_weight_decay(name: str) -> bool:
    return not any(marker in name for marker in NO_DECAY_MARKERS)


def create_optimizer(model: nn.Cell, cfg: TrainConfig, total_steps: int) -> nn.Optimizer:
    params = model.trainable_params()
    decay = [p for p in params if uses_weight_decay(p.name)]
    no_decay = [p for p in params if not uses_weight_decay(p.name)]
    lr = Tensor(warmup_cosine(cfg.lr, cfg.min_lr, cfg.warmup_steps, total_steps))
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return nn.AdamWeightDecay(groups, learning_rate=lr, beta1=0.9, beta2=0.98, eps=1e-6)
