"""Training objectives, one small Cell each, mixed by `MultimodalLoss` with the recipe's weights.

easy-VQA has only 24 distinct captions and 107 distinct questions, so a batch holds many equal
texts. The contrastive loss therefore takes group ids and treats every pair in the same group as a
positive (a uniform target over the group) instead of CLIP's identity target, which would punish the
model for matching an image to a correct but duplicated caption.

Every objective is a mean over samples (the LM loss too: each sample's mean over its answer tokens),
so splitting a batch into micro-batches or data-parallel ranks and averaging their gradients gives the
whole batch's gradient; the contrastive loss needs the whole batch's embeddings for its negatives,
which a `gather` cell hands it under data parallelism (mindvl.train.distributed).
"""
import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindvl.cells.multimodal_lm import MultimodalLMLoss
from mindvl.data.reading.loader import LABEL_COLUMNS, TRAIN_COLUMNS  # MultimodalLoss.construct takes these, in order

LOSS_NAMES = ("contrastive", "answer", "lm")


class GroupContrastiveLoss(nn.Cell):
    """Symmetric InfoNCE over L2-normalised embeddings with group-aware positives."""

    def __init__(self):
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, emb_a, emb_b, scale, groups):
        # emb_a, emb_b: (B, E) normalised; scale: scalar; groups: (B,) int32
        logits = self.matmul(emb_a, emb_b) * scale  # (B, B)
        positives = ops.equal(groups.expand_dims(1), groups.expand_dims(0)).astype(ms.float32)
        targets = positives / positives.sum(axis=1, keepdims=True)
        loss_ab = -(targets * self.log_softmax(logits)).sum(axis=1).mean()
        loss_ba = -(targets * self.log_softmax(logits.T)).sum(axis=1).mean()
        return (loss_ab + loss_ba) / 2


class AnswerLoss(nn.Cell):
    """Cross-entropy of the answer classifier over the closed answer set."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, answer):
        return self.ce(logits, answer)


class LMLoss(nn.Cell):
    """Next-token cross-entropy over the answer text: per sample the mean over its non-[PAD] targets
    (id 0), then the mean over samples (a sample without targets adds 0)."""

    def __init__(self, pad_id: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, logits, targets):
        # logits: (B, L, V); targets: (B, L)
        batch, length, vocab = logits.shape
        per_token = self.ce(logits.reshape(batch * length, vocab), targets.reshape(batch * length))
        keep = ops.not_equal(targets, self.pad_id).astype(ms.float32)  # (B, L)
        per_sample = (per_token.reshape(batch, length) * keep).sum(axis=1) / ops.maximum(keep.sum(axis=1), 1.0)
        return per_sample.mean()


class LossWeighting(nn.Cell):
    """parts (3,) in LOSS_NAMES order -> total.

    "fixed": sum of w_i L_i. "uncertainty" (Kendall, Gal & Cipolla, 2018): sum of exp(-s_i) L_i + s_i
    with learned s_i (log variances) starting at -log(w_i), so training starts at the fixed mix; an
    objective with w_i = 0 stays off.
    """

    def __init__(self, weights, mode: str = "fixed"):
        super().__init__()
        values = np.array([getattr(weights, name) for name in LOSS_NAMES], np.float32)
        self.learned = mode == "uncertainty"
        self.active = Tensor((values > 0).astype(np.float32))
        self.weights = Tensor(values)
        if self.learned:
            init = [-math.log(v) if v > 0 else 0.0 for v in values]
            self.log_variance = Parameter(Tensor(np.array(init, np.float32)), name="log_variance")

    def construct(self, parts):
        if self.learned:
            return (self.active * (ops.exp(-self.log_variance) * parts + self.log_variance)).sum()
        return (self.weights * parts).sum()

    def effective_weights(self) -> np.ndarray:
        """The weights each objective currently gets (exp(-s_i) when learned)."""
        if self.learned:
            return self.active.asnumpy() * np.exp(-self.log_variance.asnumpy())
        return self.weights.asnumpy()


class MultimodalLoss(nn.Cell):
    """Network + objectives: returns the weighted total and the stacked parts in LOSS_NAMES order.

    construct takes the labels (LABEL_COLUMNS), then the network's inputs: the model's (MODEL_COLUMNS,
    so TRAIN_COLUMNS in all) or, for a TokenInputModel over cached encoder outputs, TOKEN_COLUMNS.
    The network is called as network(answer_in, *inputs). Shapes: mindvl.data.reading.loader and
    mindvl.data.reading.packing. `gather` (data parallel): a cell handing every rank the whole batch of
    embeddings and group ids for the contrastive loss, in rank order.
    """

    part_names = LOSS_NAMES  # the trainer logs the parts by these names

    def __init__(self, network, weights, pad_id: int = 0, weighting: str = "fixed", gather: nn.Cell = None):
        super().__init__()
        self.network = network
        self.contrastive = GroupContrastiveLoss()
        self.answer_loss = AnswerLoss()
        self.lm_loss = LMLoss(pad_id)
        self.weighting = LossWeighting(weights, weighting)
        self.gather = gather

    def objectives(self):
        return self.contrastive, self.answer_loss, self.lm_loss

    def construct(self, answer, answer_tokens, question_group, caption_group, *inputs):
        answer_in = answer_tokens[:, :-1]  # teacher forcing: predict token t+1 from tokens <= t
        parts = self.task_parts(answer, answer_tokens, question_group, caption_group, self.network(answer_in, *inputs))
        return self.weighting(parts), parts

    def task_parts(self, answer, answer_tokens, question_group, caption_group, outputs):
        """The unweighted objectives (3,) in LOSS_NAMES order from the network's first 8 outputs (a
        distillation loss reuses them on a student that returns more)."""
        answer_next = answer_tokens[:, 1:]
        (answer_logits, lm_logits, image_emb, caption_emb, audio_emb, question_emb,
         scale_image_text, scale_audio_text) = outputs[:8]
        if self.gather is not None:
            image_emb, caption_emb = self.gather(image_emb), self.gather(caption_emb)
            audio_emb, question_emb = self.gather(audio_emb), self.gather(question_emb)
            question_group, caption_group = self.gather(question_group), self.gather(caption_group)
        contrastive = (self.contrastive(image_emb, caption_emb, scale_image_text, caption_group)
                       + self.contrastive(audio_emb, question_emb, scale_audio_text, question_group)) / 2
        answer = self.answer_loss(answer_logits, answer)
        lm = self.lm_loss(lm_logits, answer_next)
        return ops.stack([contrastive, answer, lm])


class GenerativeLoss(nn.Cell):
    """The generative model's objective as the train step takes it: (loss, parts (1,)), the mean next-token
    cross-entropy over the assistant's tokens (cells.multimodal_lm.MultimodalLMLoss). Under data parallelism
    (`rank_mean`) each rank divides by the ranks' mean label count, so the reduced gradient is the global
    batch's token mean exactly. Gradient accumulation averages the micro-batches' means: the global token
    mean when they hold equal label counts, close to it otherwise. construct takes
    mindvl.data.reading.conversation_loader.CONVERSATION_TRAIN_COLUMNS, in order."""

    part_names = ("lm",)
    weighting = None  # one objective: nothing to weight

    def __init__(self, network, rank_mean: nn.Cell = None):
        super().__init__(auto_prefix=False)
        self.loss = MultimodalLMLoss(network, rank_mean)

    def objectives(self):
        return (self.loss.ce,)

    def construct(self, labels, weight, *inputs):
        loss = self.loss(labels, weight, *inputs)
        return loss, ops.stack([loss])
