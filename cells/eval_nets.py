"""Evaluation views of a MultimodalModel that encode each batch once.

The deployable graphs (export_nets.py) run the encoders inside every call, so greedy decoding would
re-encode the image and the question for every answer token. Evaluation splits the work instead:
`EncodeNet` computes the encoders' states once per batch (or they come from the frozen encoders'
cache, mindvl.pretrained.tokens), and `StateAnswerNet` / `StateGenerateNet` run only the fusion and
heads on them, computing what AnswerNet / GenerateNet compute. Parameter names stay the model's
(auto_prefix=False).
"""
from mindspore import nn, ops


class EncodeNet(nn.Cell):
    """(image, question_ids, question_mask, audio_mel, audio_mask) -> (image_tokens, question_tokens,
    audio_tokens) (MultimodalModel.encode)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, image, question_ids, question_mask, audio_mel, audio_mask):
        return self.model.encode(image, question_ids, question_mask, audio_mel, audio_mask)


class StateAnswerNet(nn.Cell):
    """(image_tokens, question_tokens, question_mask, audio_tokens, audio_mask (per frame), use_text,
    use_audio) -> answer probabilities (B, num_answers), as AnswerNet."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.softmax = ops.Softmax(axis=-1)

    def construct(self, image_tokens, question_tokens, question_mask, audio_tokens, audio_mask, use_text, use_audio):
        inputs = self.model.fusion_states(image_tokens, question_tokens, question_mask, audio_tokens, audio_mask,
                                          use_text, use_audio)
        return self.softmax(self.model.answer_logits(*inputs))


class StateGenerateNet(nn.Cell):
    """StateAnswerNet's inputs + answer_in (B, La) int32 -> LM logits (B, La, vocab), as GenerateNet."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, image_tokens, question_tokens, question_mask, audio_tokens, audio_mask, use_text, use_audio,
                  answer_in):
        inputs = self.model.fusion_states(image_tokens, question_tokens, question_mask, audio_tokens, audio_mask,
                                          use_text, use_audio)
        return self.model.lm_logits(*inputs, answer_in)
