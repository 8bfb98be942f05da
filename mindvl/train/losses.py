"""Training objectives, one small Cell each, mixed by `MultimodalLoss` with the recipe's weights.

easy-VQA has only 24 distinct captions and 107 distinct questions, so a batch holds many equal
texts. The contrastive loss therefore takes group ids and treats every pair in the same group as a
positive (a uniform target over the group) instead of CLIP's identity target, which would punish the
model for matching an image to a correct but duplicated caption.
"""
import mindspore as ms
from mindspore import nn, ops

from mindvl.data.loader import LABEL_COLUMNS, TRAIN_COLUMNS  # MultimodalLoss.construct takes these, in order

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
    """Next-token cross-entropy over the answer text, ignoring [PAD] targets (id 0)."""

    def __init__(self, pad_id: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, logits, targets):
        # logits: (B, L, V); targets: (B, L)
        batch, length, vocab = logits.shape
        per_token = self.ce(logits.reshape(batch * length, vocab), targets.reshape(batch * length))
        keep = ops.not_equal(targets.reshape(batch * length), self.pad_id).astype(ms.float32)
        return (per_token * keep).sum() / ops.maximum(keep.sum(), 1.0)


class MultimodalLoss(nn.Cell):
    """Network + objectives: returns the weighted total and the stacked parts in LOSS_NAMES order.

    construct takes the labels (LABEL_COLUMNS), then the network's inputs: the model's (MODEL_COLUMNS,
    so TRAIN_COLUMNS in all) or, for a TokenInputModel over cached encoder outputs, TOKEN_COLUMNS.
    The network is called as network(answer_in, *inputs). Shapes: mindvl.data.loader and
    mindvl.data.packing.
    """

    def __init__(self, network, weights, pad_id: int = 0):
        super().__init__()
        self.network = network
        self.contrastive = GroupContrastiveLoss()
        self.answer_loss = AnswerLoss()
        self.lm_loss = LMLoss(pad_id)
        self.w_contrastive = weights.contrastive
        self.w_answer = weights.answer
        self.w_lm = weights.lm

    def construct(self, answer, answer_tokens, question_group, caption_group, *inputs):
        answer_in = answer_tokens[:, :-1]  # teacher forcing: predict token t+1 from tokens <= t
        answer_next = answer_tokens[:, 1:]
        (answer_logits, lm_logits, image_emb, caption_emb, audio_emb, question_emb,
         scale_image_text, scale_audio_text) = self.network(answer_in, *inputs)
        contrastive = (self.contrastive(image_emb, caption_emb, scale_image_text, caption_group)
                       + self.contrastive(audio_emb, question_emb, scale_audio_text, question_group)) / 2
        answer = self.answer_loss(answer_logits, answer)
        lm = self.lm_loss(lm_logits, answer_next)
        total = self.w_contrastive * contrastive + self.w_answer * answer + self.w_lm * lm
        return total, ops.stack([contrastive, answer, lm])
