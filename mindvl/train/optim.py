"""Optimizer and module policies: parameter groups per module (their own learning-rate scale and weight
decay, or frozen), decay only on matrices, and selective recomputation of Transformer blocks."""
from typing import Dict, List, Sequence

from mindspore import Parameter, Tensor, nn

from mindvl.config import STACKS, TrainConfig
from mindvl.runs import parameter_paths
from mindvl.train.schedule import warmup_cosine

NO_DECAY_MARKERS = ("bias", "beta", "gamma", "norm", "logit_scale", "embedding", "cls_token", "pos_")


def uses_weight_decay(name: str) -> bool:
    return not any(marker in name for marker in NO_DECAY_MARKERS)


def module_of(name: str) -> str:
    """The train.modules entry a parameter belongs to: its top-level cell, or `heads` for the rest
    (projections, logit scales, answer and LM heads)."""
    top = name.split(".", 1)[0]
    if top == "decoder":  # a generative model's decoder stands where the fusion Transformer does
        return "fusion"
    if top == "tower":  # a native-resolution VLM's vision tower (a ViT tower's projector: with the heads)
        return "heads" if name.startswith("tower.projector.") else "vision"
    return top if top in STACKS else "heads"


def stack_blocks(model: nn.Cell, module: str):
    """(path, blocks) of stack `module` (a STACKS name): <module>.encoder.blocks, or decoder.blocks for
    "fusion" in a generative model; (path, None) when the model has no such stack (a generative model's
    text is read by the decoder)."""
    if module == "fusion" and hasattr(model, "decoder"):
        return "decoder.blocks", model.decoder.blocks
    stack = getattr(model, module, None)
    return f"{module}.encoder.blocks", None if stack is None else stack.encoder.blocks


def freeze_modules(model: nn.Cell, cfg: TrainConfig) -> None:
    """train.modules.<m>.frozen: those parameters get no gradient and no optimizer state."""
    for name, param in parameter_paths(model).items():
        if getattr(cfg.modules, module_of(name)).frozen:
            param.requires_grad = False


def apply_recompute(model: nn.Cell, cfg: TrainConfig) -> List[str]:
    """Recompute the listed Transformer blocks in the backward pass instead of keeping their activations;
    returns the blocks' names. An index past a stack's depth is an error naming the module."""
    names = []
    for module in STACKS:
        indices = getattr(cfg.modules, module).recompute
        path, blocks = stack_blocks(model, module)
        if indices and blocks is None:
            raise ValueError(f"train.modules.{module}.recompute: this model has no {module} stack")
        for index in indices:
            if index >= len(blocks):
                raise ValueError(f"train.modules.{module}.recompute: block {index} does not exist "
                                 f"({module} has {len(blocks)} blocks, 0..{len(blocks) - 1})")
            blocks[index].recompute()
            names.append(f"{path}.{index}")
    return names


def create_optimizer(model: nn.Cell, cfg: TrainConfig, total_steps: int,
                     extra: Sequence[Parameter] = ()) -> nn.Optimizer:
    """AdamWeightDecay over the model's trainable parameters following the warmup-cosine schedule, in
    groups of equal (lr_scale, weight decay): each module's own, no decay on vectors and scales. Groups
    at lr_scale 1 use the optimizer's schedule (per-group schedules cost compile time: 10 of them took
    the tiny step from 14 s to 22 s); `extra` parameters (learned loss weights) never decay."""
    schedule = warmup_cosine(cfg.lr, cfg.min_lr, cfg.warmup_steps, total_steps)
    groups: Dict[tuple, List[Parameter]] = {}
    for name, param in parameter_paths(model).items():
        if not param.requires_grad:
            continue
        settings = getattr(cfg.modules, module_of(name))
        decay = cfg.weight_decay if settings.weight_decay is None else settings.weight_decay
        groups.setdefault((settings.lr_scale, decay if uses_weight_decay(name) else 0.0), []).append(param)
    if extra:
        groups.setdefault((1.0, 0.0), []).extend(extra)
    if not groups:
        raise ValueError("train.modules: every module is frozen, nothing to train")
    return nn.AdamWeightDecay([{"params": params, "weight_decay": decay,
                                **({"lr": Tensor(schedule * scale)} if scale != 1.0 else {})}
                               for (scale, decay), params in groups.items()],
                              learning_rate=Tensor(schedule), beta1=0.9, beta2=0.98, eps=1e-6)


def group_indices(optimizer: nn.Optimizer, names: Dict[int, str]) -> Dict[str, tuple]:
    """Per module, the positions of its parameters in optimizer.parameters (for gradient norms).
    `names`: id(parameter) -> its name in the model; other parameters (learned loss weights, distillation
    feature maps) count as `objective`."""
    groups: Dict[str, list] = {}
    for index, param in enumerate(optimizer.parameters):
        name = names.get(id(param))
        groups.setdefault(module_of(name) if name else "objective", []).append(index)
    return {module: tuple(indices) for module, indices in groups.items()}
