"""The tri-modal model: three encoders, the early-fusion Transformer and the heads.

Training calls `construct` (every output the losses need, one graph). Deployment uses the small
wrappers in `export_nets.py`, which run only the branch each graph needs.

Checkpoint keys start with the child name: vision., text., audio., fusion., image_proj., text_proj.,
audio_proj., logit_scale_image_text., logit_scale_audio_text., answer_head., lm_head.
"""
from mindspore import nn, ops

from .audio import AudioEncoder
from .fusion import FusionTransformer
from .heads import ContrastiveHead, LogitScale, NormDenseHead
from .text import TextEncoder
from .vision import VisionEncoder


class MultimodalModel(nn.Cell):
    """construct(answer_in, image, <the packed columns>) ->
    (answer_logits (B, num_answers), lm_logits (B, La, vocab), image_emb, caption_emb, audio_emb,
     question_emb (each (B, embed_dim), unit length), scale_image_text, scale_audio_text (scalars,
     exp'd and clamped to <= 100)).

    image (B, 3, S, S) float32 normalised; answer_in (B, La) int32 teacher-forced answer ids. Everything
    else arrives packed, in mindvl.data.reading.packing.PACK_COLUMNS order (layouts in that module's docstring):
      text_pack_ids, text_pack_positions, text_pack_segment, text_index: questions (index rows 0..B-1)
        and captions (rows B..2B-1) in shared rows (TextEncoder.construct_packed);
      audio_pack_mel, audio_pack_segment, audio_pack_positions, audio_index: the clips in shared rows
        (AudioEncoder.construct_packed);
      pack_index, pack_segment, pack_answer, cls_index, answer_index: the fusion sequences
        (FusionTransformer.construct_packed), which also express the per-sample question-modality choice
        (use_text / use_audio) by which text and audio slots they include.
    question_emb is the text projection of the question's pooled output (always computed, whatever the
    fusion sees). The packed layouts compute what the padded ones do (one sample per row, with masks):
    `fusion_inputs` and the export wrappers keep the padded inputs and masks, and give the same logits
    and embeddings (tests/cells/test_packed_model.py).
    """

    def __init__(self, model_cfg, pre):
        super().__init__()
        self.vision = VisionEncoder(model_cfg.vision, pre.image_size, model_cfg.dropout)
        self.text = TextEncoder(model_cfg.text, model_cfg.dropout)
        self.audio = AudioEncoder(model_cfg.audio, pre.n_mels, pre.max_audio_frames, model_cfg.dropout)
        self.fusion = FusionTransformer(model_cfg.fusion, model_cfg.vision.width, model_cfg.text.width,
                                        model_cfg.audio.width, model_cfg.text.vocab_size,
                                        pre.max_answer_length, model_cfg.dropout)
        self.image_proj = ContrastiveHead(model_cfg.vision.width, model_cfg.embed_dim)
        self.text_proj = ContrastiveHead(model_cfg.text.width, model_cfg.embed_dim)
        self.audio_proj = ContrastiveHead(model_cfg.audio.width, model_cfg.embed_dim)
        self.logit_scale_image_text = LogitScale(model_cfg.logit_scale_init)
        self.logit_scale_audio_text = LogitScale(model_cfg.logit_scale_init)
        self.answer_head = NormDenseHead(model_cfg.fusion.width, model_cfg.num_answers, model_cfg.fusion.norm_eps)
        self.lm_head = NormDenseHead(model_cfg.fusion.width, model_cfg.text.vocab_size, model_cfg.fusion.norm_eps)
        self.mul = ops.Mul()
        self.expand_dims = ops.ExpandDims()
        self.concat = ops.Concat(axis=0)

    # -- pieces the export wrappers reuse ---------------------------------------------------------
    def embed_image(self, image):
        """(B, 3, S, S) -> (B, embed_dim) unit-length image embedding."""
        _, pooled = self.vision(image)
        return self.image_proj(pooled)

    def embed_text(self, ids, mask):
        """(B, L) ids + mask -> (B, embed_dim) unit-length text embedding (captions and questions)."""
        _, pooled = self.text(ids, mask)
        return self.text_proj(pooled)

    def embed_audio(self, mel, frame_mask):
        """(B, n_mels, T) + (B, T) -> (B, embed_dim) unit-length audio embedding."""
        _, _, pooled = self.audio(mel, frame_mask)
        return self.audio_proj(pooled)

    def encode(self, image, question_ids, question_mask, audio_mel, audio_mask):
        """Each encoder's states in the padded layout: (image_tokens (B, 1 + N, vision width),
        question_tokens (B, Lt, text width), audio_tokens (B, T/2, audio width))."""
        image_tokens, _ = self.vision(image)
        question_tokens, _ = self.text(question_ids, question_mask)
        audio_tokens, _, _ = self.audio(audio_mel, audio_mask)
        return image_tokens, question_tokens, audio_tokens

    def fusion_states(self, image_tokens, question_tokens, question_mask, audio_tokens, audio_mask, use_text,
                      use_audio):
        """Encoder states (computed, or cached for frozen encoders) and the padded masks (audio_mask per
        frame) -> the fusion's inputs, the question modalities switched per sample through the masks:
        (image_tokens, text_tokens, text_mask, audio_tokens, audio_token_mask)."""
        text_mask = self.mul(question_mask, self.expand_dims(use_text, 1))
        audio_token_mask = self.mul(self.audio.token_mask(audio_mask), self.expand_dims(use_audio, 1))
        return image_tokens, question_tokens, text_mask, audio_tokens, audio_token_mask

    def fusion_inputs(self, image, question_ids, question_mask, audio_mel, audio_mask, use_text, use_audio):
        """Encode image and question, then `fusion_states`."""
        image_tokens, question_tokens, audio_tokens = self.encode(image, question_ids, question_mask, audio_mel,
                                                                  audio_mask)
        return self.fusion_states(image_tokens, question_tokens, question_mask, audio_tokens, audio_mask, use_text,
                                  use_audio)

    def answer_logits(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_token_mask):
        """Fusion inputs -> (B, num_answers) answer-classifier logits (the prefix alone, no answer tokens)."""
        return self.answer_head(self.fusion.construct_prefix(image_tokens, text_tokens, text_mask, audio_tokens,
                                                             audio_token_mask))

    def lm_logits(self, image_tokens, text_tokens, text_mask, audio_tokens, audio_token_mask, answer_in):
        """Fusion inputs + teacher-forced answer ids (B, La) -> (B, La, vocab) LM logits."""
        _, answer_states = self.fusion(image_tokens, text_tokens, text_mask, audio_tokens, audio_token_mask,
                                       answer_in)
        return self.lm_head(answer_states)

    # -- training graph ---------------------------------------------------------------------------
    def construct(self, answer_in, image, text_pack_ids, text_pack_positions, text_pack_segment, text_index,
                  audio_pack_mel, audio_pack_segment, audio_pack_positions, audio_index, pack_index, pack_segment,
                  pack_answer, cls_index, answer_index):
        image_tokens, image_pooled = self.vision(image)
        text_tokens, text_pooled = self.text.construct_packed(text_pack_ids, text_pack_positions, text_pack_segment,
                                                              text_index)  # (2B, Lt, width): questions, captions
        audio_tokens, audio_pooled = self.audio.construct_packed(audio_pack_mel, audio_pack_segment,
                                                                 audio_pack_positions, audio_index)
        return self.fuse(answer_in, image_tokens, image_pooled, text_tokens[:image.shape[0]], text_pooled,
                         audio_tokens, audio_pooled, pack_index, pack_segment, pack_answer, cls_index, answer_index)

    def construct_from_tokens(self, answer_in, image_tokens, question_tokens, question_mask, caption_tokens,
                              caption_mask, audio_tokens, audio_mask, pack_index, pack_segment, pack_answer,
                              cls_index, answer_index):
        """`construct` starting from the encoders' outputs (frozen encoders whose outputs were cached,
        mindvl.pretrained.tokens): image_tokens (B, 1 + N, vision width); question_tokens and
        caption_tokens (B, Lt, text width) with masks (B, Lt); audio_tokens (B, T/2, audio width) with
        the frame mask (B, T); zeros at padded slots, as the packed encoders give them. The pooled
        vectors come from the encoders' own pooling, so the outputs are `construct`'s."""
        question_pooled = self.text.pooled(question_tokens, question_mask)
        caption_pooled = self.text.pooled(caption_tokens, caption_mask)
        audio_pooled = self.audio.pool(audio_tokens, self.audio.token_mask(audio_mask))
        return self.fuse(answer_in, image_tokens, self.vision.pooled(image_tokens), question_tokens,
                         self.concat((question_pooled, caption_pooled)), audio_tokens, audio_pooled, pack_index,
                         pack_segment, pack_answer, cls_index, answer_index)

    def fuse(self, answer_in, image_tokens, image_pooled, question_tokens, text_pooled, audio_tokens, audio_pooled,
             pack_index, pack_segment, pack_answer, cls_index, answer_index):
        """Encoder outputs -> the training outputs (class docstring); text_pooled (2B, width) holds the
        questions' then the captions' pooled vectors."""
        batch = image_tokens.shape[0]
        fused = self.fusion.construct_packed(image_tokens, question_tokens, audio_tokens, answer_in, pack_index,
                                             pack_segment, pack_answer, cls_index, answer_index)
        answer_logits = self.answer_head(fused[0])
        lm_logits = self.lm_head(fused[1])
        image_emb = self.image_proj(image_pooled)
        text_emb = self.text_proj(text_pooled)  # (2B, embed_dim)
        audio_emb = self.audio_proj(audio_pooled)
        outputs = (answer_logits, lm_logits, image_emb, text_emb[batch:], audio_emb, text_emb[:batch],
                   self.logit_scale_image_text(), self.logit_scale_audio_text())
        if self.fusion.encoder.taps:
            return outputs + (fused[2],)
        return outputs

    def set_feature_taps(self, layers) -> None:
        """Make `construct` (and `construct_from_tokens`) return a 9th output: the fusion's states after
        the blocks `layers` (in that order, before the final norm) over the packed rows, (len(layers), R, S,
        fusion width), valid where pack_segment > 0. For feature distillation (mindvl.train.distill); the
        padded and export paths are unaffected. Graph mode compiles the taps as constants: call this before
        the model's training graph first runs."""
        depth = len(self.fusion.encoder.blocks)
        layers = tuple(int(layer) for layer in layers)
        if any(not 0 <= layer < depth for layer in layers):
            raise ValueError(f"feature taps {list(layers)}: the fusion has blocks 0..{depth - 1}")
        self.fusion.encoder.taps = layers


class TokenInputModel(nn.Cell):
    """The training graph of `model` from cached encoder outputs (MultimodalModel.construct_from_tokens).

    It shares the model's parameters under the model's own names (auto_prefix=False), so checkpoints,
    evaluation and export use the full model unchanged."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, *inputs):
        return self.model.construct_from_tokens(*inputs)
