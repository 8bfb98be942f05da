"""Learning-rate schedules, materialised as one value per step for MindSpore's dynamic lr."""
import math

import numpy as np


def warmup_cosine(base_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> np.ndarray:
    """Linear warmup from ~0 to `base_lr`, then cosine decay to `min_lr` at `total_steps` (float32)."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    warmup_steps = min(warmup_steps, total_steps)
    lrs = np.empty(total_steps, dtype=np.float32)
    for step in range(total_steps):
        if step < warmup_steps:
            lrs[step] = base_lr * (step + 1) / warmup_steps
        else:
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            lrs[step] = min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * progress))
    return lrs
