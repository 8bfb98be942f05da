"""BERT-layout text encoder, shared by captions (retrieval) and questions (VQA).

Embeddings = word + position + token type (always type 0: mindvl feeds single segments), then an
embedding LayerNorm and the blocks. BERT is post-LN (`pre_norm: false`); pre-LN configs get a final
LayerNorm from the stack instead. Keys follow BERT's names so its weights map one to one.
"""
from mindspore import nn, ops

from .embedding import Embedding
from .masks import padding_mask
from .norm import create_norm
from .transformer import TransformerStack


class TextEncoder(nn.Cell):
    """ids (batch, L) int32, mask (batch, L) float32 {1 token, 0 pad}, L <= cfg.max_positions ->
    (tokens (batch, L, width), pooled (batch, width) = first ([CLS]) token output).

    Checkpoint keys: word_embeddings, position_embeddings, token_type_embeddings (`.weight`),
    embed_norm, encoder.blocks.i.…
    """

    def __init__(self, cfg, dropout: float = 0.0):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError(f"model.text.vocab_size: expected the tokenizer's vocabulary size (> 0) before "
                             f"building the text encoder, got {cfg.vocab_size}; set it from the data set's "
                             f"tokenizer")
        self.width = cfg.width
        self.max_positions = cfg.max_positions
        self.word_embeddings = Embedding(cfg.vocab_size, cfg.width)
        self.position_embeddings = Embedding(cfg.max_positions, cfg.width)
        self.token_type_embeddings = Embedding(2, cfg.width)
        self.embed_norm = create_norm(cfg.width, cfg.norm_eps)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.encoder = TransformerStack(cfg, dropout)
        self.add = ops.Add()

    def construct(self, ids, mask):
        length = ids.shape[1]
        positions = self.position_embeddings.weight[:length]  # (L, width)
        token_type = self.token_type_embeddings.weight[0]  # (width,)
        x = self.add(self.add(self.word_embeddings(ids), positions), token_type)
        x = self.dropout(self.embed_norm(x))
        x = self.encoder(x, padding_mask(mask))
        return x, x[:, 0]
