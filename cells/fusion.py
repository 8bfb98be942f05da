"""Early-fusion Transformer over image, question (text and/or audio) and answer tokens.

One sequence [CLS | image | question text | audio | answer], every layer attending across modalities.
Each modality is projected to the fusion width and tagged with a learned modality-type embedding
(rows of `type_embeddings`: 0 image, 1 text, 2 audio, 3 answer). It is a prefix LM: the prefix
(CLS..audio) sees the valid prefix only, never the answer, so the CLS output (answer classifier) is
the same with or without answer tokens; answer token i sees the valid prefix and answer tokens <= i,
so teacher forcing and greedy decoding give the same logits.
"""
from mindspore import nn, ops

from .embedding import Embedding, learned_tokens
from .linear import dense
from .masks import padding_mask, prefix_lm_mask
from .transformer import TransformerStack

IMAGE, TEXT, AUDIO, ANSWER = 0, 1, 2, 3


class FusionTransformer(nn.Cell):
    """Inputs: image_tokens (B, Ni, vision_width) (all valid), text_tokens (B, Lt, text_width),
    text_mask (B, Lt), audio_tokens (B, Na, audio_width), audio_mask (B, Na), answer_in (B, La) int32
    teacher-forced answer ids, La <= max_answer_length. Masks are float {1 valid, 0 ignore}.

    `construct` -> (cls (B, width), answer_states (B, La, width)); `construct_prefix` (no answer) -> cls.
    Checkpoint keys: image_in_proj, text_in_proj, audio_in_proj, type_embeddings, cls_token,
    answer_embeddings, answer_positions, encoder.blocks.i.…, encoder.norm.
    """

    def __init__(self, cfg, vision_width: int, text_width: int, audio_width: int, vocab_size: int,
                 max_answer_length: int, dropout: float = 0.0):
        super().__init__()
        if vocab_size <= 0:
            raise ValueError(f"fusion vocab_size: expected the tokenizer's vocabulary size (> 0), got {vocab_size}")
        self.width = cfg.width
        self.max_answer_length = max_answer_length
        self.image_in_proj = dense(vision_width, cfg.width)
        self.text_in_proj = dense(text_width, cfg.width)
        self.audio_in_proj = dense(audio_width, cfg.width)
        self.type_embeddings = Embedding(4, cfg.width)
        self.cls_token = learned_tokens(1, 1, cfg.width)
        self.answer_embeddings = Embedding(vocab_size, cfg.width)
        self.answer_positions = Embedding(max_answer_length, cfg.width)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.encoder = TransformerStack(cfg, dropout)
        self.add = ops.Add()
        self.concat = ops.Concat(axis=1)
        self.tile = ops.Tile()
        self.ones_like = ops.OnesLike()

    def _prefix(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_mask):
        """-> (prefix tokens (B, P, width), prefix validity (B, P)), P = 1 + Ni + Lt + Na."""
        types = self.type_embeddings.weight
        image = self.add(self.image_in_proj(image_tokens), types[IMAGE])
        text = self.add(self.text_in_proj(text_tokens), types[TEXT])
        audio = self.add(self.audio_in_proj(audio_tokens), types[AUDIO])
        cls = self.tile(self.cls_token, (image_tokens.shape[0], 1, 1))
        image_valid = self.ones_like(image_tokens[:, :, 0])  # (B, Ni)
        valid = self.concat((image_valid[:, :1], image_valid, text_mask, audio_mask))
        return self.concat((cls, image, text, audio)), valid

    def construct_prefix(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_mask):
        """The CLS output without answer tokens (answer classification, export): (B, width)."""
        x, valid = self._prefix(image_tokens, text_tokens, text_mask, audio_tokens, audio_mask)
        x = self.encoder(self.dropout(x), padding_mask(valid))
        return x[:, 0]

    def construct(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_mask, answer_in):
        prefix, valid = self._prefix(image_tokens, text_tokens, text_mask, audio_tokens, audio_mask)
        prefix_length = prefix.shape[1]
        answer_length = answer_in.shape[1]
        answer = self.add(self.answer_embeddings(answer_in), self.answer_positions.weight[:answer_length])
        answer = self.add(answer, self.type_embeddings.weight[ANSWER])  # (B, La, width)
        x = self.dropout(self.concat((prefix, answer)))
        x = self.encoder(x, prefix_lm_mask(valid, answer_length))
        return x[:, 0], x[:, prefix_length:]
