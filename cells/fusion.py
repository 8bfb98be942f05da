"""Early-fusion Transformer over image, question (text and/or audio) and answer tokens.

One sequence [CLS | image | question text | audio | answer], every layer attending across modalities.
Each modality is projected to the fusion width and tagged with a learned modality-type embedding
(rows of `type_embeddings`: 0 image, 1 text, 2 audio, 3 answer). It is a prefix LM: the prefix
(CLS..audio) sees the valid prefix only, never the answer, so the CLS output (answer classifier) is
the same with or without answer tokens; answer token i sees the valid prefix and answer tokens <= i,
so teacher forcing and greedy decoding give the same logits.

Two layouts of the same computation: `construct` / `construct_prefix` run one padded sequence per
sample with masks (deployment), `construct_packed` runs only the valid tokens of several samples per
row with segment ids (training; mindvl/data/reading/packing.py).
"""
from mindspore import nn, ops

from .embedding import Embedding, learned_tokens
from .linear import dense
from .masks import packed_prefix_lm_mask, padding_mask, prefix_lm_mask
from .transformer import TransformerStack

IMAGE, TEXT, AUDIO, ANSWER = 0, 1, 2, 3


class FusionTransformer(nn.Cell):
    """Inputs: image_tokens (B, Ni, vision_width) (all valid), text_tokens (B, Lt, text_width),
    text_mask (B, Lt), audio_tokens (B, Na, audio_width), audio_mask (B, Na), answer_in (B, La) int32
    teacher-forced answer ids, La <= max_answer_length. Masks are float {1 valid, 0 ignore}.

    `construct` -> (cls (B, width), answer_states (B, La, width)); `construct_prefix` (no answer) -> cls;
    `construct_packed` -> the same pair from packed rows (see its docstring).
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
        self.reshape = ops.Reshape()
        self.gather = ops.Gather()

    def _prefix_tokens(self, image_tokens, text_tokens, audio_tokens):
        """-> (B, P, width) [CLS | image | text | audio], each tagged with its type; P = 1 + Ni + Lt + Na."""
        types = self.type_embeddings.weight
        image = self.add(self.image_in_proj(image_tokens), types[IMAGE])
        text = self.add(self.text_in_proj(text_tokens), types[TEXT])
        audio = self.add(self.audio_in_proj(audio_tokens), types[AUDIO])
        cls = self.tile(self.cls_token, (image_tokens.shape[0], 1, 1))
        return self.concat((cls, image, text, audio))

    def _prefix_valid(self, image_tokens, text_mask, audio_mask):
        """-> (B, P) float {1 valid, 0 ignore} matching `_prefix_tokens`: CLS and image always valid."""
        image_valid = self.ones_like(image_tokens[:, :, 0])  # (B, Ni)
        return self.concat((image_valid[:, :1], image_valid, text_mask, audio_mask))

    def _answer_tokens(self, answer_in):
        """(B, La) int32 -> (B, La, width): answer embeddings + positions 0..La-1 + the answer type."""
        answer_length = answer_in.shape[1]
        answer = self.add(self.answer_embeddings(answer_in), self.answer_positions.weight[:answer_length])
        return self.add(answer, self.type_embeddings.weight[ANSWER])

    def construct_prefix(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_mask):
        """The CLS output without answer tokens (answer classification, export): (B, width)."""
        x = self._prefix_tokens(image_tokens, text_tokens, audio_tokens)
        valid = self._prefix_valid(image_tokens, text_mask, audio_mask)
        x = self.encoder(self.dropout(x), padding_mask(valid))
        return x[:, 0]

    def construct(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_mask, answer_in):
        prefix = self._prefix_tokens(image_tokens, text_tokens, audio_tokens)
        valid = self._prefix_valid(image_tokens, text_mask, audio_mask)
        prefix_length = prefix.shape[1]
        x = self.dropout(self.concat((prefix, self._answer_tokens(answer_in))))
        x = self.encoder(x, prefix_lm_mask(valid, answer_in.shape[1]))
        return x[:, 0], x[:, prefix_length:]

    def construct_packed(self, image_tokens, text_tokens, audio_tokens, answer_in, pack_index, pack_segment,
                         pack_answer, cls_index, answer_index):
        """`construct` over packed rows: only the tokens a sample uses, several samples per row.

        image_tokens, text_tokens, audio_tokens, answer_in: as in `construct` (no masks: which text and
        audio tokens a sample uses is said by the slots the packer picked). pack_index (R, S) int32 picks
        slot b * P + p of the per-sample token table [CLS | image | text | audio | answer] (P slots) for
        each row position; pack_segment (R, S) int32 names the sample (1, 2, ... per row, 0 padding);
        pack_answer (R, S) float32 marks answer slots; cls_index (B,) and answer_index (B, La) int32 are
        the flattened row positions (r * S + s) of each sample's CLS and answer slots. Layout and
        invariants: mindvl/data/reading/packing.py. Returns (cls (B, width), answer_states (B, La, width)), equal
        to `construct` with the masks the packer's slot choice implies; with `encoder.taps` set (feature
        distillation), also the tapped blocks' states of the packed rows, (len(taps), R, S, width).

        Positions restart per segment without any position ids here: every encoder adds its positions
        per sample before the fusion, and answer positions are per sample in the token table, so a
        sample's tokens carry the same embeddings wherever they land in a row.
        """
        table = self.concat((self._prefix_tokens(image_tokens, text_tokens, audio_tokens),
                             self._answer_tokens(answer_in)))  # (B, P, width)
        batch, slots, width = table.shape
        table = self.reshape(table, (batch * slots, width))
        x = self.dropout(self.gather(table, pack_index, 0))  # (R, S, width)
        mask = packed_prefix_lm_mask(pack_segment, pack_answer)
        if self.encoder.taps:
            x, states = self.encoder.construct_tapped(x, mask)
            return self._sample_states(x, cls_index, answer_index) + (states,)
        return self._sample_states(self.encoder(x, mask), cls_index, answer_index)

    def _sample_states(self, x, cls_index, answer_index):
        """Packed rows (R, S, width) -> each sample's (cls (B, width), answer_states (B, La, width))."""
        rows, length, width = x.shape
        x = self.reshape(x, (rows * length, width))
        return self.gather(x, cls_index, 0), self.gather(x, answer_index, 0)
