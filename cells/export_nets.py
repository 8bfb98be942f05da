"""Tensor-in, tensor-out views of a MultimodalModel, one per deployable graph.

Each wrapper computes only its branch, so an exported MindIR carries no dead encoders. They share the
model's parameters and are built with auto_prefix=False, so parameter names (and checkpoint keys)
stay exactly the model's (`vision.…`), not `model.vision.…`.
"""
from mindspore import nn, ops
from mindspore.common import dtype as mstype


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


class VQANet(nn.Cell):
    """AnswerNet's inputs -> (answer_logits (B, num_answers), answer_ids (B, answer_length - 1) int32).

    The deployable VQA graph: the answer classifier's logits and the greedily generated answer, decoded
    inside the graph so a consumer needs no model code. The decoding loop is unrolled (answer_length - 1
    fusion passes over a fixed-length answer, see GenerateNet); a row that produced [EOS] continues with
    [PAD], which is what mindvl.eval.vqa.greedy_decode returns. Token tensors derive their shape from
    question_ids, so the batch dimension may stay dynamic.
    """

    def __init__(self, model, answer_length: int, bos_id: int, eos_id: int, pad_id: int):
        super().__init__(auto_prefix=False)
        if answer_length < 2:
            raise ValueError(f"answer_length: expected >= 2 ([BOS] and one generated token), got {answer_length}")
        self.model = model
        self.steps = answer_length - 1
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.argmax = ops.Argmax(axis=-1, output_type=mstype.int32)
        self.concat = ops.Concat(axis=1)
        self.equal = ops.Equal()
        self.logical_or = ops.LogicalOr()
        self.select = ops.Select()
        self.zeros_like = ops.ZerosLike()
        self.expand_dims = ops.ExpandDims()

    def construct(self, image, question_ids, question_mask, audio_mel, audio_mask, use_text, use_audio):
        inputs = self.model.fusion_inputs(image, question_ids, question_mask, audio_mel, audio_mask,
                                          use_text, use_audio)
        answer_logits = self.model.answer_logits(*inputs)
        column = self.zeros_like(question_ids[:, :1])  # (B, 1) int32
        tokens = column + self.bos_id
        if self.steps > 1:
            tokens = self.concat((tokens, self.zeros_like(question_ids[:, :self.steps - 1]) + self.pad_id))
        finished = self.equal(column[:, 0], 1)  # all False
        generated = None  # (B, position) ids so far; concatenated, not a list (lists do not export to ONNX)
        for position in range(self.steps):
            logits = self.model.lm_logits(*inputs, tokens)  # (B, steps, vocab)
            next_token = self.select(finished, column[:, 0] + self.pad_id, self.argmax(logits[:, position]))
            column_ids = self.expand_dims(next_token, 1)
            generated = column_ids if generated is None else self.concat((generated, column_ids))
            finished = self.logical_or(finished, self.equal(next_token, self.eos_id))
            if position + 1 < self.steps:  # static: the loop unrolls, empty slices never reach Concat
                pieces = (tokens[:, :position + 1], column_ids)
                if position + 2 < self.steps:
                    pieces = pieces + (tokens[:, position + 2:],)
                tokens = self.concat(pieces)
        return answer_logits, generated


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
    """(text_ids (B, L) int32, text_mask (B, L) float32) -> (B, embed_dim) unit-length retrieval embedding.
    (Argument names become the input names of an ONNX export: they match the package manifest's.)"""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, text_ids, text_mask):
        return self.model.embed_text(text_ids, text_mask)


class AudioEmbedNet(nn.Cell):
    """(audio_mel (B, n_mels, T) float32, audio_mask (B, T) float32 per frame) -> (B, embed_dim) unit-length
    embedding."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, audio_mel, audio_mask):
        return self.model.embed_audio(audio_mel, audio_mask)


# ----------------------------------------------------------------------------- a MultimodalLM's generation graphs
# Masks arrive as int32 (0/1), not bool: every runtime a package reaches (GraphCell, Lite, the C++ runner) takes
# int32 tensors; the graphs cast them. The caches are separate inputs and outputs (cells.decoder.Decode).

class AttachmentNet(nn.Cell):
    """(image (B, 3, S, S), audio_mel (B, n_mels, T), audio_mask (B, T)) -> (image_tokens (B, Ni, width),
    audio_tokens (B, Na, width)): the attachments in the decoder's width, once per prompt."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, image, audio_mel, audio_mask):
        return self.model.encode(image, audio_mel, audio_mask)


class PrefillNet(nn.Cell):
    """(ids, valid, slot_index (B, L) int32, image_tokens, audio_tokens) -> (last logits (B, vocab), every
    layer's key cache, then every layer's value cache (B, cache_len, kv_width)): one prompt-length bucket."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.cast = ops.Cast()

    def construct(self, ids, valid, slot_index, image_tokens, audio_tokens):
        x = self.model.embed(ids, slot_index, image_tokens, audio_tokens)
        logits, keys, values = self.model.decoder.prefill_embedded(x, self.cast(valid, mstype.bool_))
        return (logits,) + keys + values


class DecodeNet(nn.Cell):
    """(token, position, slot (B, 1) int32, slot_valid (B, cache_len) int32, caches) -> (logits (B, vocab),
    caches): one step of every running sequence, each at its own cache slot. wide: the step of many rows
    (cells.decoder.Decode's), whose outputs are the new key and value rows (B, 1, kv_width) in place of the caches."""

    def __init__(self, model, wide: bool = False):
        super().__init__(auto_prefix=False)
        self.lm = model.decoder
        self.layers = self.lm.layers
        self.wide = wide
        self.beside = wide and self.lm.attends_beside()
        self.cast = ops.Cast()

    def construct(self, token, position, slot, slot_valid, *caches):
        logits, keys, values = self.lm.decode(token, position, slot, self.cast(slot_valid, mstype.bool_),
                                              caches[:self.layers], caches[self.layers:], self.wide, self.beside)
        return (logits,) + keys + values


# ----------------------------------------------------------------------------- a NativeVLM's generation graphs

class NativeVisionNet(nn.Cell):
    """(patches (1, V, patch_values), vision_positions (1, V, 2), frames, windows (1, V) int32, restore (T,) int32)
    -> vision_tokens (T, width): a batch's images packed in V patches (engine.vision_layout.graph_inputs), their
    merged tokens in the processor's order, padded to the package's token capacity T."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.tower = model.tower

    def construct(self, patches, vision_positions, frames, windows, restore):
        return self.tower(patches, vision_positions, frames, windows, restore)[0]


class ViTVisionNet(nn.Cell):
    """(patches (1, V, patch_values), placement (1, V, 2 + table^2) float32, segments (1, V) int32, keep (T * merge^2,)
    int32) -> vision_tokens (T, width): a ViT tower's (cells.native_vision.ViTTower) vision graph, the images packed
    in V rows (engine.vision_layout.ViTPacking), their merged tokens padded to the package's token capacity T."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.tower = model.tower

    def construct(self, patches, placement, segments, keep):
        return self.tower(patches, placement, segments, keep)[0]


class NativeSpeechNet(nn.Cell):
    """(mel (B, n_mels, T), frame_mask (B, T) float32) -> audio_tokens (B, A, width): the clips of a native VLM that
    hears (cells.native_vlm.NativeVLM.speech), each its pooled, projected tokens (zeros in, the projector's bias
    out: a row without a clip, whose slots nothing reads)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, mel, frame_mask):
        return self.model.speech(mel, frame_mask)


class NativePrefillNet(nn.Cell):
    """(ids, valid (B, L) int32, positions (B, L, 3) int32 M-RoPE (or (B, L): a 1-D decoder), slot_index (B, L) int32, vision_tokens (T,
    width)[, audio_tokens (B, A, width): a model that hears]) -> (last logits, every layer's key cache, then every
    value cache): one prompt-length bucket; slot_index T (T + B x A where it hears) marks text."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.cast = ops.Cast()

    def construct(self, ids, valid, positions, slot_index, vision_tokens, *audio_tokens):
        table = self.model.table(vision_tokens, audio_tokens[0]) if self.model.hears else vision_tokens
        x = self.model.fill(ids, table, slot_index)
        logits, keys, values = self.model.decoder.prefill_embedded(x, self.cast(valid, mstype.bool_), positions)
        return (logits,) + keys + values
