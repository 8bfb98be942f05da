"""BERT-layout text encoder, shared by captions (retrieval) and questions (VQA).

Embeddings = word + position + token type (always type 0: mindvl feeds single segments), then an
embedding LayerNorm and the blocks. BERT is post-LN (`pre_norm: false`); pre-LN configs get a final
LayerNorm from the stack instead. Keys follow BERT's names so its weights map one to one.

Two layouts of the same computation: `construct` runs one padded sequence per row with a padding mask
(deployment), `construct_packed` runs rows of several sequences with segment ids and per-sequence
position ids (training; mindvl/data/reading/packing.py). A sequence's tokens get the same embeddings and see
the same keys in both, so both give the same token states and pooled output.
"""
from mindspore import nn, ops

from .embedding import Embedding
from .masks import padding_mask, segment_mask
from .norm import create_norm
from .packed import gather_tokens, slot_valid
from .pooling import MaskedMean
from .transformer import TransformerStack


class TextEncoder(nn.Cell):
    """ids (batch, L) int32, mask (batch, L) float32 {1 token, 0 pad}, L <= cfg.max_positions ->
    (tokens (batch, L, width), pooled (batch, width)): pooled is the [CLS] token's output
    (`cfg.pooling: cls`, BERT) or the mean of the valid tokens (`mean`, sentence-transformers; they
    L2-normalise it afterwards, as mindvl's contrastive heads do).

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
        self.mean_pooling = cfg.pooling == "mean"
        self.pool = MaskedMean()
        self.add = ops.Add()

    def _embed(self, ids, positions):
        """ids (batch, L) int32, positions (L, width) or (batch, L, width) -> (batch, L, width)."""
        token_type = self.token_type_embeddings.weight[0]  # (width,)
        x = self.add(self.add(self.word_embeddings(ids), positions), token_type)
        return self.dropout(self.embed_norm(x))

    def construct(self, ids, mask):
        positions = self.position_embeddings.weight[:ids.shape[1]]  # (L, width)
        x = self.encoder(self._embed(ids, positions), padding_mask(mask))
        return x, self.pooled(x, mask)

    def pooled(self, tokens, valid):
        """tokens (batch, L, width), valid (batch, L) -> (batch, width): the sentence vector of the
        token states (also applied to cached states, mindvl.pretrained.tokens)."""
        return self.pool(tokens, valid) if self.mean_pooling else tokens[:, 0]

    def construct_packed(self, ids, positions, segment, index):
        """Packed rows -> per-sequence outputs, equal to `construct` on each sequence alone.

        ids, positions, segment: (R, S) int32 rows of several sequences (token ids, position within the
        sequence, segment 1.. per sequence and 0 at padding); index (N, L) int32: the flattened row
        position of token j of sequence n, R * S where sequence n has no token j (cells/packed.py).
        Returns (tokens (N, L, width), zero where a sequence has no token; pooled (N, width)).
        """
        x = self._embed(ids, self.position_embeddings(positions))
        x = self.encoder(x, segment_mask(segment))  # (R, S, width)
        tokens = gather_tokens(x, index)
        return tokens, self.pooled(tokens, slot_valid(x, index))
