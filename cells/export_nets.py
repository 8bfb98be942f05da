"""Tensor-in, tensor-out views of a MultimodalModel, one per deployable graph.

Each wrapper computes only its branch, so an exported MindIR carries no dead encoders. They share the
model's parameters and are built with auto_prefix=False, so parameter names (and checkpoint keys)
stay exactly the model's (`vision.…`), not `model.vision.…`.
"""
from mindspore import nn, ops


class AnswerNet(nn.Cell):
    """(image, question_ids, question_mask, audio_mel, audio_mask, use_text, use_audio)
    -> answer probabilities (B, num_answers) (softmax of the answer head)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, image, question_ids, question_mask, audio_mel, audio_mask, use_text, use_audio):
        inputs = self.model.fusion_inputs(image, question_ids, question_mask, audio_mel, audio_mask,
                                          use_text, use_audio)
        return self.softmax(self.model.answer_logits(*inputs))


class GenerateNet(nn.Cell):
    """AnswerNet's inputs + answer_in (B, La) int32 -> LM logits (B, La, vocab).

    Greedy decoding: keep La fixed (pad with any id), read the logits at the last filled position;
    the causal mask makes later (padding) positions irrelevant, so one compiled graph serves every step.
    """

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, image, question_ids, question_mask, audio_mel, audio_mask, use_text, use_audio,
                  answer_in):
        inputs = self.model.fusion_inputs(image, question_ids, question_mask, audio_mel, audio_mask,
                                          use_text, use_audio)
        return self.model.lm_logits(*inputs, answer_in)


class ImageEmbedNet(nn.Cell):
    """image (B, 3, S, S) -> (B, embed_dim) unit-length retrieval embedding."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, image):
        return self.model.embed_image(image)


class TextEmbedNet(nn.Cell):
    """(ids (B, L) int32, mask (B, L) float32) -> (B, embed_dim) unit-length retrieval embedding."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, mask):
        return self.model.embed_text(ids, mask)


class AudioEmbedNet(nn.Cell):
    """(mel (B, n_mels, T) float32, frame mask (B, T) float32) -> (B, embed_dim) unit-length embedding."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, mel, mask):
        return self.model.embed_audio(mel, mask)
