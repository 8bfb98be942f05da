"""Structured pruning: drop the least important attention heads and FFN channels, then fine-tune briefly.

Importance is first-order Taylor (Molchanov et al., 2019): |w * dL/dw| of every weight, with L the real
training loss (the trainer's MultimodalLoss on TrainStream batches), summed over a few batches and then
over the weights a unit owns: a head's q/k/v rows (weights and biases) and out_proj columns, an FFN
channel's fc1 row and bias and fc2 column. Every layer of a stack keeps the same number of heads and of
channels, each layer its own most important ones, so the pruned stack is again one EncoderConfig:
heads = k with head_dim kept, mlp_ratio = m / width (round(width * m / width) == m exactly).

Heads and channels are permutation invariant, so the kept ones are laid out most important first:
keeping all of them permutes the weights and changes no output (tests/train/test_prune.py checks it).
"""
import copy
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
from mindspore import ParameterTuple, nn, ops

from mindvl.cells import build_cells, count_cell_parameters
from mindvl.config import STACKS, Config, EncoderConfig
from mindvl.data.reading.stream import TrainStream
from mindvl.data.root import load_tokenizer
from mindvl.errors import ConfigError
from mindvl.model_factory import load_model, merge_lora
from mindvl.runs import CHECKPOINTS, assign_state
from mindvl.train.arguments import TrainingArguments
from mindvl.train.losses import MultimodalLoss
from mindvl.train.trainer import Trainer

HEAD_ROWS = ("q_proj", "k_proj", "v_proj")  # projections whose output rows are grouped by head
PRUNABLE = re.compile(rf"^({'|'.join(STACKS)})\.encoder\.blocks\.\d+\."
                      r"(attn\.(q_proj|k_proj|v_proj|out_proj)|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
RECORD_FILE = "prune.json"


@dataclass
class StackImportance:
    heads: np.ndarray  # (layers, heads) summed |w * dL/dw| of each head's weights
    channels: np.ndarray  # (layers, FFN hidden) the same per FFN channel


@dataclass
class StackPlan:
    heads: List[List[int]]  # per layer: the kept head indices, most important first
    channels: List[List[int]]  # per layer: the kept FFN channel indices, most important first


def head_dim(encoder: EncoderConfig) -> int:
    return encoder.head_dim or encoder.width // encoder.heads


def mlp_hidden(encoder: EncoderConfig) -> int:
    return int(round(encoder.width * encoder.mlp_ratio))


class _Gradients(nn.Cell):
    """dL/dw of `weights` for one training batch, in one graph."""

    def __init__(self, loss_net: nn.Cell, weights: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.grad_fn = ops.value_and_grad(loss_net, None, weights, has_aux=True)

    def construct(self, *batch):
        _, grads = self.grad_fn(*batch)
        return grads


def taylor_saliency(cfg: Config, model: nn.Cell, batches: int = 8) -> Dict[str, np.ndarray]:
    """|w * dL/dw| of every prunable weight (attention projections, FFN), summed over the first `batches`
    training batches of `cfg`'s data; keyed by parameter name, each shaped like its parameter. The model
    runs in eval mode (no dropout), so the scores are reproducible."""
    if batches < 1:
        raise ConfigError(f"importance batches: expected >= 1, got {batches}")
    params = {name: param for name, param in model.parameters_and_names() if PRUNABLE.match(name)}
    names = list(params)
    loss_net = MultimodalLoss(model, cfg.train.loss_weights, load_tokenizer(cfg.data.root).pad_id,
                              cfg.train.loss_weighting)
    loss_net.set_train(False)
    gradients = _Gradients(loss_net, ParameterTuple([params[name] for name in names]))
    values = {name: params[name].asnumpy() for name in names}
    saliency = {name: np.zeros_like(value) for name, value in values.items()}
    stream = iter(TrainStream(cfg))
    try:
        for _ in range(batches):
            _, batch = next(stream)
            for name, grad in zip(names, gradients(*batch)):
                saliency[name] += np.abs(values[name] * grad.asnumpy())
    finally:
        stream.close()
    return saliency


def unit_importance(model_cfg, saliency: Dict[str, np.ndarray]) -> Dict[str, StackImportance]:
    """Per-weight saliency -> per head and per FFN channel of every stack (module docstring)."""
    result = {}
    for stack in STACKS:
        encoder = getattr(model_cfg, stack)
        heads, size = encoder.heads, head_dim(encoder)
        head_scores, channel_scores = [], []
        for layer in range(encoder.layers):
            prefix = f"{stack}.encoder.blocks.{layer}."
            block = {name[len(prefix):]: value for name, value in saliency.items() if name.startswith(prefix)}
            score = block["attn.out_proj.weight"].reshape(encoder.width, heads, size).sum(axis=(0, 2))
            for projection in HEAD_ROWS:
                for leaf in ("weight", "bias"):  # rows h * head_dim .. (h + 1) * head_dim - 1 are head h's
                    score = score + block[f"attn.{projection}.{leaf}"].reshape(heads, -1).sum(axis=1)
            head_scores.append(score)
            channel_scores.append(block["mlp.fc1.weight"].sum(axis=1) + block["mlp.fc1.bias"]
                                  + block["mlp.fc2.weight"].sum(axis=0))
        result[stack] = StackImportance(np.stack(head_scores), np.stack(channel_scores))
    return result


def importance(cfg: Config, model: nn.Cell, batches: int = 8) -> Dict[str, StackImportance]:
    """First-order Taylor importance of every head and FFN channel (module docstring)."""
    return unit_importance(cfg.model, taylor_saliency(cfg, model, batches))


def _kept(count: int, keep: float) -> int:
    return max(1, int(round(keep * count)))


def plan_pruning(model_cfg, scores: Dict[str, StackImportance], keep_heads: float,
                 keep_mlp: float) -> Dict[str, StackPlan]:
    """Which heads and channels each layer keeps: the round(keep * count) (at least 1) most important."""
    for name, keep in (("--keep-heads", keep_heads), ("--keep-mlp", keep_mlp)):
        if not 0.0 < keep <= 1.0:
            raise ConfigError(f"{name}: expected a fraction in (0, 1], got {keep}")
    plans = {}
    for stack in STACKS:
        encoder, score = getattr(model_cfg, stack), scores[stack]
        expected = (encoder.layers, encoder.heads), (encoder.layers, mlp_hidden(encoder))
        if (score.heads.shape, score.channels.shape) != expected:
            raise ConfigError(f"importance of model.{stack}: shapes {score.heads.shape}, {score.channels.shape} "
                             f"do not fit its config {expected}; compute it for this model")
        heads, channels = _kept(encoder.heads, keep_heads), _kept(mlp_hidden(encoder), keep_mlp)
        plans[stack] = StackPlan(
            heads=[np.argsort(-row, kind="stable")[:heads].tolist() for row in score.heads],
            channels=[np.argsort(-row, kind="stable")[:channels].tolist() for row in score.channels])
    return plans


def _slice_block(state: Dict[str, np.ndarray], prefix: str, heads: List[int], channels: List[int],
                 size: int) -> None:
    """Keep `heads` (of head_dim `size`) and FFN `channels` of the block at `prefix`, in that order."""
    rows = (np.asarray(heads)[:, None] * size + np.arange(size)).reshape(-1)  # (kept heads * head_dim,)
    for projection in HEAD_ROWS:
        for leaf in ("weight", "bias"):
            state[f"{prefix}attn.{projection}.{leaf}"] = state[f"{prefix}attn.{projection}.{leaf}"][rows]
    state[f"{prefix}attn.out_proj.weight"] = state[f"{prefix}attn.out_proj.weight"][:, rows]
    state[f"{prefix}mlp.fc1.weight"] = state[f"{prefix}mlp.fc1.weight"][channels]
    state[f"{prefix}mlp.fc1.bias"] = state[f"{prefix}mlp.fc1.bias"][channels]
    state[f"{prefix}mlp.fc2.weight"] = state[f"{prefix}mlp.fc2.weight"][:, channels]


def prune_model(cfg: Config, model: nn.Cell, scores: Dict[str, StackImportance], keep_heads: float,
                keep_mlp: float) -> Tuple[Config, nn.Cell]:
    """(pruned_cfg, pruned_model): every stack keeps round(keep_heads * heads) heads and round(keep_mlp *
    hidden) FFN channels per layer, the most important of each layer (`scores` from `importance`); every
    other weight is copied. pruned_cfg has heads = k, head_dim = the original head size, mlp_ratio =
    m / width, and no model.pretrained folders or cache: the pruned encoders no longer match the converted
    ones and their weights travel in the model. LoRA must be merged first (mindvl.model_factory.merge_lora)."""
    with_lora = [f"model.{stack}" for stack in STACKS if getattr(cfg.model, stack).lora_rank]
    if with_lora:
        raise ConfigError(f"{', '.join(with_lora)}: LoRA adapters (lora_rank > 0) cannot be sliced with their "
                         f"projections; fold them in first with mindvl.model_factory.merge_lora(cfg, model)")
    plans = plan_pruning(cfg.model, scores, keep_heads, keep_mlp)
    pruned_cfg = copy.deepcopy(cfg)
    state = {name: param.asnumpy() for name, param in model.parameters_and_names()}
    for stack, plan in plans.items():
        original, encoder = getattr(cfg.model, stack), getattr(pruned_cfg.model, stack)
        encoder.heads, encoder.head_dim = len(plan.heads[0]), head_dim(original)
        encoder.mlp_ratio = len(plan.channels[0]) / original.width
        for layer in range(original.layers):
            _slice_block(state, f"{stack}.encoder.blocks.{layer}.", plan.heads[layer], plan.channels[layer],
                         head_dim(original))
    pretrained = pruned_cfg.model.pretrained
    pretrained.vision = pretrained.text = pretrained.audio = pretrained.cache = ""
    pruned_cfg.validate()
    pruned = build_cells(pruned_cfg.model, pruned_cfg.preprocess)
    assign_state(pruned, state, "the pruned weights")
    pruned.set_train(False)
    return pruned_cfg, pruned


def _compact_lists(text: str) -> str:
    """Indented JSON with each list of numbers on one line (kept indices: thousands of channels); only
    lists spanning lines match, and a JSON string never holds a raw newline."""
    return re.sub(r"\[(\n[-\d.,\s]+)\]", lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
                  text)


def prune_and_finetune(run_or_checkpoint: str, out_dir: str, keep_heads: float, keep_mlp: float, steps: int,
                       importance_batches: int = 8, lr_scale: float = 0.3, progress: bool = True,
                       log: Callable[[str], None] = print) -> Dict[str, object]:
    """Load a trained run, score its heads and channels, prune them, fine-tune the pruned model `steps` steps
    with the real trainer (lr = lr_scale x the run's, warmup steps // 10) into `out_dir`, a normal run folder
    that `mindvl.model_factory.load_model(out_dir)` reads. Returns the record also written to out_dir/prune.json: settings,
    parameters before (LoRA merged, adapters not counted) and after, per stack the kept heads and channels
    per layer, the fine-tune's result. `log` gets one line per phase; `progress`: the trainer's bar."""
    if steps < 1:
        raise ConfigError(f"steps: expected >= 1 fine-tuning steps, got {steps}")
    if lr_scale <= 0:
        raise ConfigError(f"lr_scale: expected a factor > 0 of the run's learning rate, got {lr_scale}")
    out_dir = Path(out_dir)
    if (out_dir / CHECKPOINTS).is_dir() and any((out_dir / CHECKPOINTS).iterdir()):
        raise ConfigError(f"{out_dir}: already holds checkpoints, which loading would mix with the pruned "
                         f"run's; pick a new or empty out_dir")
    cfg, model, _ = load_model(str(run_or_checkpoint))
    merged = [f"model.{stack}" for stack in STACKS if getattr(cfg.model, stack).lora_rank]
    cfg, model = merge_lora(cfg, model)
    before = count_cell_parameters(model)
    log(f"prune: loaded {run_or_checkpoint} ({before:,} parameters"
        f"{'; LoRA merged into ' + ', '.join(merged) if merged else ''})")
    start = time.perf_counter()
    scores = importance(cfg, model, importance_batches)
    importance_seconds = round(time.perf_counter() - start, 1)
    log(f"prune: importance (first-order Taylor) over {importance_batches} training batches in "
        f"{importance_seconds} s")
    plans = plan_pruning(cfg.model, scores, keep_heads, keep_mlp)
    pruned_cfg, pruned = prune_model(cfg, model, scores, keep_heads, keep_mlp)
    after = count_cell_parameters(pruned)
    shapes = ", ".join(f"{stack} {getattr(cfg.model, stack).heads}->{getattr(pruned_cfg.model, stack).heads} heads "
                       f"{mlp_hidden(getattr(cfg.model, stack))}->{mlp_hidden(getattr(pruned_cfg.model, stack))} "
                       f"channels" for stack in STACKS)
    log(f"prune: {shapes}; parameters {before:,} -> {after:,} ({after / before:.1%})")
    train = pruned_cfg.train
    train.output_dir, train.max_steps = str(out_dir), steps
    train.lr = lr_scale * cfg.train.lr
    train.min_lr = min(train.min_lr, train.lr)
    train.warmup_steps = max(1, steps // 10)
    log(f"prune: fine-tuning {steps} steps at lr {train.lr:g} into {out_dir}")
    result = Trainer(pruned, TrainingArguments(pruned_cfg, progress=progress)).train()
    record = {
        "source": str(run_or_checkpoint),
        "settings": {"keep_heads": keep_heads, "keep_mlp": keep_mlp, "steps": steps,
                     "importance_batches": importance_batches, "lr": train.lr, "warmup_steps": train.warmup_steps},
        "lora_merged": merged,
        "parameters": {"before": before, "after": after},
        "importance_seconds": importance_seconds,
        "stacks": {stack: {"heads": [getattr(cfg.model, stack).heads, getattr(pruned_cfg.model, stack).heads],
                           "head_dim": head_dim(getattr(cfg.model, stack)),
                           "mlp_hidden": [mlp_hidden(getattr(cfg.model, stack)),
                                          mlp_hidden(getattr(pruned_cfg.model, stack))],
                           "kept_heads": plan.heads, "kept_channels": plan.channels}
                   for stack, plan in plans.items()},
        "finetune": {"checkpoint": result.checkpoint, "steps": result.steps, "first_losses": result.first_losses,
                     "final_losses": result.final_losses, "best": result.best},
    }
    (out_dir / RECORD_FILE).write_text(_compact_lists(json.dumps(record, indent=2)))
    log(f"prune: done; checkpoint {result.checkpoint}, record {out_dir / RECORD_FILE}")
    return record
