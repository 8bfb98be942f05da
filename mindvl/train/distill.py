"""Knowledge distillation (train.distill): a frozen teacher run guides the recipe's smaller model.

The teacher runs inside the student's training graph on the same packed batch, so every packed position
means the same token for both: that is why teacher and student must share the data build (tokenizer,
answers) and every preprocess setting and the patch size (`check_teacher`). The student learns its
own objectives plus soft targets (KL of the temperature-softened answer and LM distributions, Hinton et
al. 2015) and, on the chosen fusion blocks, the teacher's hidden states through a learned linear map
(FitNets, Romero et al. 2015). The map trains with the student but lives in the loss cell, so checkpoints
hold the student alone (the trainer keeps the map's values in the optimizer state for resume); the
teacher's parameters never train and are never saved.
"""
from pathlib import Path
from typing import Dict, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindvl.cells.linear import dense
from mindvl.config import Config, DataConfig, DistillConfig, config_from_dict
from mindvl.data import load_meta, load_tokenizer
from mindvl.data.reading.loader import MODEL_COLUMNS
from mindvl.errors import CheckpointError, ConfigError
from mindvl.model_factory import load_model
from mindvl.runs import read_run_config, resolve_checkpoint
from mindvl.train.losses import LOSS_NAMES, MultimodalLoss

DISTILL_NAMES = ("kd_answer", "kd_lm", "kd_feature")
STATE_PREFIX = "distill/"  # the feature maps' values in the optimizer state's `extra` arrays


# ----------------------------------------------------------------------------- the teacher

def teacher_config(cfg: Config) -> Tuple[Config, Path]:
    """The teacher run's config and weights file, checked against the (data-bound) student `cfg`."""
    source = cfg.train.distill.teacher
    if cfg.model.pretrained.cache:
        raise ConfigError("train.distill.teacher: distillation runs the teacher on the packed inputs, which "
                          "cached encoder states (model.pretrained.cache) skip; set model.pretrained.cache=''")
    try:
        weights = resolve_checkpoint(Path(source))
        teacher = config_from_dict(read_run_config(weights))
    except CheckpointError as exc:
        raise ConfigError(f"train.distill.teacher: {exc}") from exc
    check_teacher(cfg, teacher, source)
    return teacher, weights


def check_teacher(cfg: Config, teacher: Config, source: str) -> None:
    """Refuse a teacher that would read the student's batches differently, naming the key that differs."""
    def differ(key: str, theirs, ours) -> ConfigError:
        return ConfigError(f"{key}: the teacher {source} was trained with {theirs!r}, this recipe has {ours!r}; "
                           f"distillation feeds both models the same batches, so they must agree")

    for key, theirs in vars(teacher.preprocess).items():
        if theirs != getattr(cfg.preprocess, key):
            raise differ(f"preprocess.{key}", theirs, getattr(cfg.preprocess, key))
    if teacher.model.vision.patch_size != cfg.model.vision.patch_size:  # the packed token table's layout
        raise differ("model.vision.patch_size", teacher.model.vision.patch_size, cfg.model.vision.patch_size)
    for key, theirs, ours in (("model.text.vocab_size", teacher.model.text.vocab_size, cfg.model.text.vocab_size),
                              ("model.num_answers", teacher.model.num_answers, cfg.model.num_answers)):
        if theirs != ours:
            raise ConfigError(f"{key}: the teacher {source} has {theirs}, the data in {cfg.data.root} gives {ours}; "
                              f"the teacher must be trained on the same data build (data.root)")
    _check_same_data(cfg.data, teacher.data, source)
    for index, (teacher_block, student_block) in enumerate(cfg.train.distill.feature_layers):
        for who, block, depth in (("teacher", teacher_block, teacher.model.fusion.layers),
                                  ("student", student_block, cfg.model.fusion.layers)):
            if block >= depth:
                raise ConfigError(f"train.distill.feature_layers[{index}]: {who} fusion block {block} does not "
                                  f"exist (the {who}'s fusion has blocks 0..{depth - 1})")


def _check_same_data(data: DataConfig, teacher_data: DataConfig, source: str) -> None:
    """Same tokens and answers in the same order (ids and classes mean the same); skipped when the
    teacher's data folder is gone (the sizes were compared already)."""
    theirs, ours = Path(teacher_data.root), Path(data.root)
    if not (theirs / "meta.json").is_file() or theirs.resolve() == ours.resolve():
        return
    if _vocabulary(theirs) != _vocabulary(ours):
        raise ConfigError(f"data.root: the teacher {source} was trained on {theirs}, whose tokenizer differs from "
                          f"{ours}'s; distil on the data the teacher was trained on")
    if load_meta(theirs)["answers"] != load_meta(ours)["answers"]:
        raise ConfigError(f"data.root: the teacher {source} was trained on {theirs}, whose answers "
                          f"{load_meta(theirs)['answers']} differ from {ours}'s {load_meta(ours)['answers']}")


def _vocabulary(root: Path) -> Dict[str, int]:
    return load_tokenizer(root).tokenizer.get_vocab(with_added_tokens=True)


def load_teacher(cfg: Config) -> Tuple[Config, nn.Cell]:
    """(teacher config, teacher model with its weights) of `cfg.train.distill.teacher`, checked first."""
    teacher_cfg, weights = teacher_config(cfg)
    return teacher_cfg, load_model(weights)[1]


class FrozenTeacher(nn.Cell):
    """The teacher inside the training graph: no parameter trains, dropout stays off whatever the trainer's
    set_train says, and no gradient flows back through its outputs."""

    def __init__(self, model: nn.Cell):
        super().__init__()
        self.model = model
        for param in model.get_parameters():
            param.requires_grad = False
        self.set_train(False)

    def add_flags_recursive(self, **flags):
        if "training" in flags:  # set_train(True) on the training step reaches here
            flags["training"] = False
        return super().add_flags_recursive(**flags)

    def construct(self, *inputs):
        return ops.stop_gradient(self.model(*inputs))


# ----------------------------------------------------------------------------- the objectives

class SoftTargetKL(nn.Cell):
    """KL(teacher || student) of logits (..., C) softened by `temperature`, times T^2 so the soft targets'
    gradients keep their scale whatever T (Hinton et al.); -> (...,) per row."""

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, student, teacher):
        log_p_teacher = self.log_softmax(teacher / self.temperature)
        log_p_student = self.log_softmax(student / self.temperature)
        kl = (ops.exp(log_p_teacher) * (log_p_teacher - log_p_student)).sum(axis=-1)
        return kl * (self.temperature * self.temperature)


class FeatureLoss(nn.Cell):
    """Per (teacher tap, student tap) pair: a learned Dense maps the student's fusion states to the teacher's
    width; the loss is the squared error, mean over the valid packed slots (pack_segment > 0) and the
    teacher's channels, then over pairs.

    construct(student_states (Ts, R, S, Ws), teacher_states (Tt, R, S, Wt), pack_segment (R, S)); `pairs`
    holds (teacher tap position, student tap position) into those stacks.
    """

    def __init__(self, student_width: int, teacher_width: int, pairs: Sequence[Tuple[int, int]]):
        super().__init__()
        self.pairs = tuple(tuple(pair) for pair in pairs)
        self.projections = nn.CellList([dense(student_width, teacher_width) for _ in self.pairs])
        self.teacher_width = teacher_width

    def construct(self, student_states, teacher_states, pack_segment):
        valid = ops.expand_dims((pack_segment > 0).astype(ms.float32), -1)  # (R, S, 1)
        count = valid.sum() * self.teacher_width
        total = ops.zeros((), ms.float32)
        for index in range(len(self.pairs)):
            teacher_tap, student_tap = self.pairs[index]
            error = self.projections[index](student_states[student_tap]) - teacher_states[teacher_tap]
            total = total + (ops.square(error) * valid).sum() / count
        return total / len(self.pairs)


class DistillationLoss(nn.Cell):
    """The student's objectives (`task`, a MultimodalLoss over the student) plus distillation from the
    frozen teacher, called like MultimodalLoss: labels, then the model's inputs (MODEL_COLUMNS).

    Returns (total, parts): total = task_weight x the task's weighted total + the weighted distillation
    terms; parts = the 3 task parts then the active distillation parts, named in `part_names` (a term
    whose weight is 0, or the feature term without feature_layers, is neither computed nor logged).
    """

    def __init__(self, task: MultimodalLoss, teacher: nn.Cell, settings: DistillConfig, student_width: int,
                 teacher_width: int, pad_id: int = 0):
        super().__init__()
        self.task = task
        self.teacher = FrozenTeacher(teacher)
        self.kl = SoftTargetKL(settings.temperature)
        self.pad_id = pad_id
        self.task_weight = settings.task_weight
        self.answer_weight = settings.answer_weight
        self.lm_weight = settings.lm_weight
        self.feature_weight = settings.feature_weight if settings.feature_layers else 0.0
        active = (self.answer_weight > 0, self.lm_weight > 0, self.feature_weight > 0)
        self.part_names = LOSS_NAMES + tuple(name for name, on in zip(DISTILL_NAMES, active) if on)
        self.segment_position = MODEL_COLUMNS.index("pack_segment")
        if self.feature_weight > 0:
            teacher_taps, student_taps = feature_taps(settings.feature_layers)
            self.features = FeatureLoss(student_width, teacher_width,
                                        [(teacher_taps.index(t), student_taps.index(s))
                                         for t, s in settings.feature_layers])

    @property
    def weighting(self):
        """The task objectives' LossWeighting (the trainer logs and checkpoints its learned weights)."""
        return self.task.weighting

    def construct(self, answer, answer_tokens, question_group, caption_group, *inputs):
        answer_in = answer_tokens[:, :-1]
        student = self.task.network(answer_in, *inputs)
        teacher = self.teacher(answer_in, *inputs)
        task_parts = self.task.task_parts(answer, answer_tokens, question_group, caption_group, student)
        total = self.task_weight * self.task.weighting(task_parts)
        parts = ()
        if self.answer_weight > 0:
            kd_answer = self.kl(student[0], teacher[0]).mean()
            total = total + self.answer_weight * kd_answer
            parts = parts + (kd_answer,)
        if self.lm_weight > 0:
            kd_lm = self.lm_kl(student[1], teacher[1], answer_tokens[:, 1:])
            total = total + self.lm_weight * kd_lm
            parts = parts + (kd_lm,)
        if self.feature_weight > 0:
            kd_feature = self.features(student[8], teacher[8], inputs[self.segment_position])
            total = total + self.feature_weight * kd_feature
            parts = parts + (kd_feature,)
        return total, ops.concat((task_parts, ops.stack(parts)))

    def lm_kl(self, student, teacher, targets):
        """Per sample the mean KL over its non-[PAD] answer targets, then the mean over samples (as LMLoss)."""
        keep = ops.not_equal(targets, self.pad_id).astype(ms.float32)  # (B, La)
        per_sample = (self.kl(student, teacher) * keep).sum(axis=1) / ops.maximum(keep.sum(axis=1), 1.0)
        return per_sample.mean()

    def projections(self) -> Dict[str, Parameter]:
        """The feature maps' parameters by their key in the checkpoint's extra state (not the student's)."""
        if self.feature_weight == 0:
            return {}
        return {f"{STATE_PREFIX}{name}": param for name, param in self.features.parameters_and_names()}

    def projection_state(self) -> Dict[str, np.ndarray]:
        return {key: param.asnumpy() for key, param in self.projections().items()}

    def load_projection_state(self, extra: Dict[str, np.ndarray]) -> None:
        """Restore `projection_state` from a checkpoint's extra arrays."""
        for key, param in self.projections().items():
            if key not in extra:
                raise CheckpointError(f"the checkpoint has no {key}: it was written without these "
                                      f"train.distill.feature_layers")
            param.set_data(Tensor(extra[key]))


def feature_taps(feature_layers: Sequence[Sequence[int]]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(teacher blocks, student blocks) to tap, each sorted and distinct."""
    return (tuple(sorted({t for t, _ in feature_layers})), tuple(sorted({s for _, s in feature_layers})))


def distillation_loss(cfg: Config, model: nn.Cell, task: MultimodalLoss,
                      teacher: Tuple[Config, nn.Cell]) -> DistillationLoss:
    """Wrap the student's objectives `task` with distillation from `teacher` (load_teacher's pair), setting
    the feature taps on the teacher and the student `model`: call it before any graph of theirs compiles."""
    settings = cfg.train.distill
    teacher_cfg, teacher = teacher
    if settings.feature_layers and settings.feature_weight > 0:
        teacher_taps, student_taps = feature_taps(settings.feature_layers)
        teacher.set_feature_taps(teacher_taps)
        model.set_feature_taps(student_taps)
    return DistillationLoss(task, teacher, settings, cfg.model.fusion.width, teacher_cfg.model.fusion.width,
                            load_tokenizer(cfg.data.root).pad_id)


__all__ = ["DistillationLoss", "FeatureLoss", "SoftTargetKL", "FrozenTeacher", "DISTILL_NAMES", "check_teacher",
           "teacher_config", "load_teacher", "distillation_loss"]
