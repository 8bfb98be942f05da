"""The training wiring: a recipe and its model -> the data stream, objectives, optimizer and compiled step.

Built in one place so that the Trainer (which runs the loop, resumes and checkpoints) and the train-step
benchmark (benchmarks/train_step.py, which times the step on a synthetic batch) run the same step: a change to
how a run is put together reaches both. The order is part of the behaviour: the teacher is checked before any
data work, the kernels are chosen before the encoders' states are cached (they compute them), and the optimizer
comes last, over the model's parameters and the objectives' own (learned loss weights, distillation maps).
"""
import logging
import time
from dataclasses import dataclass
from typing import AbstractSet, Callable, Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import amp, nn

from mindvl.cells import TokenInputModel
from mindvl.cells.kernels import use_kernels
from mindvl.config import Config, ModelConfig, TrainConfig
from mindvl.data import load_tokenizer
from mindvl.data.reading.conversation_loader import ConversationStream, conversation_inputs
from mindvl.data.reading.native_conversations import NativeConversationStream
from mindvl.data.reading.loader import MODEL_COLUMNS, split_inputs
from mindvl.data.reading.stream import ResumableStream, TrainStream
from mindvl.errors import ConfigError
from mindvl.preprocess.text import PAD, SPECIAL_TOKENS
from mindvl.pretrained.bind import base_weights
from mindvl.pretrained.tokens import EncoderTokens, token_cache
from mindvl.runs import parameter_paths
from mindvl.train.distill import distillation_loss, load_teacher
from mindvl.train.distributed import GatherWithGrad, RankMean, gradient_reducer, init_data_parallel, sum_over_ranks
from mindvl.train.losses import GenerativeLoss, MultimodalLoss
from mindvl.train.optim import apply_recompute, create_optimizer, freeze_modules, group_indices
from mindvl.train.precision import NoLossScaling, apply_precision, set_objective_precision
from mindvl.train.schedule import warmup_cosine
from mindvl.train.step import TrainStep

logger = logging.getLogger("mindvl.train")


@dataclass
class TrainingParts:
    """What `build_training` wired, for a loop to run. `stream` and `tokens` are None for a fixed batch."""

    stream: Optional[ResumableStream]  # the training micro-batches, resumable
    tokens: Optional[EncoderTokens]  # frozen encoders' cached states (filled), or None: they run every step
    token_cache_seconds: float  # spent filling `tokens`
    kernel_swaps: int  # cells use_kernels switched to fused kernels (train.kernels)
    recomputed: List[str]  # Transformer blocks recomputed in backward (train.modules.<m>.recompute)
    base: Dict[str, Dict]  # the frozen converted folders a checkpoint names instead of storing their weights
    base_parameters: AbstractSet[str]  # those weights' paths in the model
    total_steps: int
    lr: np.ndarray  # the learning rate at each step (total_steps,), for the logs
    loss_net: nn.Cell  # the objectives over the model (plus the teacher's when distilling)
    optimizer: nn.Optimizer
    groups: Dict[str, Tuple[int, ...]]  # module -> its parameters' positions in optimizer.parameters
    scaler: amp.LossScaler
    train_step: TrainStep


def build_training(cfg: Config, model: nn.Cell, *, batch: Optional[Dict[str, ms.Tensor]] = None,
                   log: Callable[[str], None] = logger.info, warn: Callable[[str], None] = logger.warning,
                   progress: bool = False) -> TrainingParts:
    """Wire `model` (from create_model, `cfg` bound to its data set) for training as `cfg` says: kernels,
    frozen modules and recomputation set on it in place, the data stream, precision, objectives, parallel
    strategy, distillation, optimizer, loss scaler and TrainStep.

    `batch`: a fixed batch by column (the stream's columns, in its order) to wire for instead of the recipe's
    data set, for timing the step without one: no stream and no token cache are built, the kernels are timed on
    it, train.max_steps is the schedule's length, each TrainStep call is a whole optimizer step and the LM
    objective skips mindvl's word tokenizer's [PAD]. `log`: progress lines (a data-parallel caller passes one that
    writes on rank 0 only); `warn`: data left out; `progress`: bars while the token cache fills."""
    train_cfg = cfg.train
    if batch is not None and not train_cfg.max_steps:
        raise ConfigError("train.max_steps: a fixed batch has no epoch to count; set the schedule's length")
    rank, world = init_data_parallel()  # idempotent: after the Trainer's own call it only reports
    strategy = None
    if train_cfg.parallel:  # the strategy file sets micro-batches and recompute before they are read
        from mindvl.parallel.apply import prepare_training
        strategy = prepare_training(cfg, model, world)
    _check_recipe(cfg)
    # checked and loaded before any data work: a teacher that does not fit the recipe fails fast
    teacher = load_teacher(cfg) if train_cfg.distill.teacher else None
    kernel_swaps = use_kernels(model, train_cfg.kernels, compute=train_cfg.precision.compute,
                               probe=lambda: model_forward(cfg.model, model, batch if batch is not None
                                                           else first_batch(cfg, model)),
                               log=log, agree=sum_over_ranks if world > 1 else None)
    freeze_modules(model, train_cfg)
    recomputed = apply_recompute(model, train_cfg)
    # frozen converted weights are not stored: a checkpoint names their folders and sha256 instead
    base, base_parameters = base_weights(model, cfg.model) if cfg.model.generative else ({}, frozenset())
    if batch is None:
        tokens, stream, token_cache_seconds = _training_data(cfg, model, log, warn, progress)
    else:
        tokens, stream, token_cache_seconds = None, None, 0.0
    total_steps = train_cfg.max_steps or train_cfg.epochs * stream.steps_per_epoch
    network = model if tokens is None else TokenInputModel(model)
    if cfg.model.generative:
        loss_net = GenerativeLoss(apply_precision(network, train_cfg.precision), RankMean(world) if world > 1 else None)
    else:
        pad_id = load_tokenizer(cfg.data.root).pad_id if batch is None else SPECIAL_TOKENS.index(PAD)
        loss_net = MultimodalLoss(apply_precision(network, train_cfg.precision), train_cfg.loss_weights, pad_id,
                                  train_cfg.loss_weighting, GatherWithGrad(rank, world))
    set_objective_precision(loss_net.objectives(), train_cfg.precision)
    if strategy is not None and ms.get_auto_parallel_context("parallel_mode") == "semi_auto_parallel":
        from mindvl.parallel.apply import apply_loss_strategy  # Ascend: prepare_training set the context
        apply_loss_strategy(loss_net, strategy)
    if teacher is not None:  # the student's objectives plus the teacher's (mindvl.train.distill)
        loss_net = distillation_loss(cfg, model, loss_net, teacher)
    inside = {id(param) for param in model.get_parameters()}  # learned loss weights, feature maps: outside
    optimizer = create_optimizer(model, train_cfg, total_steps,
                                 extra=[p for p in loss_net.trainable_params() if id(p) not in inside])
    groups = group_indices(optimizer, {id(param): name for name, param in parameter_paths(model).items()})
    scaler = loss_scaler(train_cfg)
    accumulation = stream.accumulation if stream is not None else 1  # a fixed batch is a whole step
    train_step = TrainStep(loss_net, optimizer, scaler, train_cfg.grad_clip, list(groups.values()), accumulation,
                           gradient_reducer(optimizer.parameters, world), RankMean(world))
    return TrainingParts(stream=stream, tokens=tokens, token_cache_seconds=token_cache_seconds,
                         kernel_swaps=kernel_swaps, recomputed=recomputed, base=base, base_parameters=base_parameters,
                         total_steps=total_steps,
                         lr=warmup_cosine(train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_steps, total_steps),
                         loss_net=loss_net, optimizer=optimizer, groups=groups, scaler=scaler, train_step=train_step)


def _training_data(cfg: Config, model: nn.Cell, log: Callable[[str], None], warn: Callable[[str], None],
                   progress: bool) -> Tuple[Optional[EncoderTokens], ResumableStream, float]:
    """(the frozen encoders' token cache, filled, or None: they run every step; the training stream, over the
    cache when there is one; the seconds the fill took). `model` is the one the kernels were chosen for: its
    encoders compute the cached states."""
    tokens = token_cache(cfg, model)
    stream = training_stream(cfg, model, tokens)
    if getattr(stream, "left_out", None):
        row, reason = next(iter(stream.left_out.items()))
        warn(f"{len(stream.left_out)} training conversation(s) do not fit a packed row of "
             f"{cfg.data.packing.length} tokens and are left out (row {row}: {reason}); raise "
             f"data.packing.length or lower model.projector's token counts to train on them")
    if tokens is None:
        return None, stream, 0.0
    start = time.perf_counter()
    inputs = conversation_inputs(cfg, "train") if cfg.model.generative else split_inputs(cfg, "train")
    tokens.fill(model, *inputs, log=log, progress=progress)
    return tokens, stream, round(time.perf_counter() - start, 1)


def _check_recipe(cfg: Config) -> None:
    """What training cannot do with this recipe: refused before any work, naming the setting."""
    if cfg.model.generative and cfg.train.distill.teacher:
        raise ConfigError("train.distill.teacher: not available for a generative recipe yet (model.decoder); "
                          "remove it to train the generative model")
    if cfg.train.eval_every and cfg.data.validation_fraction <= 0:
        raise ConfigError("train.eval_every: evaluation during training needs a validation split; set "
                          "data.validation_fraction (e.g. 0.05) or train.eval_every=0")


def loss_scaler(cfg: TrainConfig) -> amp.LossScaler:
    """train.loss_scale: dynamic scaling when asked, or ("auto") when the policy computes in float16;
    otherwise none (NoLossScaling keeps a scale of 1 for the logs and checkpoints)."""
    settings = cfg.loss_scale
    if settings.mode == "dynamic" or (settings.mode == "auto" and cfg.precision.low_dtype == "float16"):
        return amp.DynamicLossScaler(settings.init, settings.factor, settings.window)
    return NoLossScaling()


def training_stream(cfg: Config, model: nn.Cell, tokens=None, shard_id: Optional[int] = None,
                    num_shards: Optional[int] = None) -> ResumableStream:
    """The recipe's training stream: the conversations for a generative model (slots sized by `model`), the
    examples for the classifier; from cached encoder states with `tokens`."""
    if cfg.model.is_native:
        return NativeConversationStream(cfg, shard_id, num_shards, tokens=tokens)
    if cfg.model.generative:
        return ConversationStream(cfg, model.image_tokens, model.audio_tokens, shard_id, num_shards, tokens=tokens)
    return TrainStream(cfg, shard_id, num_shards, tokens=tokens)


def first_batch(cfg: Config, model: nn.Cell) -> Dict[str, ms.Tensor]:
    """The first training micro-batch by column, from a stream of its own, so that the run's data position
    is untouched."""
    stream = training_stream(cfg, model)
    batches = iter(stream)
    try:
        return dict(zip(stream.columns, next(batches)[1]))
    finally:
        batches.close()


def model_forward(model_cfg: ModelConfig, model: nn.Cell, columns: Dict[str, ms.Tensor]) -> None:
    """`model` on a training batch's columns, as the objectives call it: the shapes train.kernels "auto" times
    its operations at."""
    if model_cfg.generative:
        model(*list(columns.values())[2:])  # after the labels and their weights: the model's inputs
    else:
        model(columns["answer_tokens"][:, :-1], *(columns[name] for name in MODEL_COLUMNS))
