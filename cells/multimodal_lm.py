"""The generative multimodal model: image and audio encoders -> projectors -> a pretrained decoder that
answers in words (LLaVA's recipe, with speech).

Early fusion happens in the decoder's own sequence. The chat template (mindvl/chat.py) leaves a slot per
modality token in the token ids; the model embeds the ids, then writes each image's and each clip's
projected tokens into their slots, so every decoder layer attends across text, image and speech exactly
as a prompt of that length. Training rows are packed (several conversations per row, each with its own
causal mask and positions: CausalLM.packed_states), and the LM head runs only at the positions whose
next token is learnt (the assistant's), a few dozen per row instead of every position.

Checkpoint keys: vision., audio. (the encoders' own), image_proj., audio_proj., decoder. (CausalLM's:
decoder.embed.weight, decoder.blocks.N..., decoder.norm.weight).
"""
from mindspore import nn, ops

from .activation import create_activation
from .audio import AudioEncoder
from .decoder import CausalLM
from .graph_entry import GraphEntry
from .linear import dense
from .slots import SlotWriter
from .vision import VisionEncoder


def pool_factor(tokens: int, budget: int, square: bool) -> int:
    """The smallest k that divides the grid side (square: tokens = side^2 patches pooled in k x k blocks) or
    the sequence (runs of k) and leaves at most `budget` tokens."""
    side = int(round(tokens ** 0.5)) if square else tokens
    for k in range(1, side + 1):
        if side % k == 0 and (side // k) ** (2 if square else 1) <= budget:
            return k
    raise ValueError(f"no pooling of {tokens} tokens fits {budget}")


def modality_tokens(model_cfg, pre):
    """(grid side, image pooling, image tokens, audio pooling, audio tokens) of a generative recipe: what one
    image and one clip take in the decoder's sequence (the data loader sizes its slots with it, no model built)."""
    proj = model_cfg.projector
    grid = pre.image_size // model_cfg.vision.patch_size
    image_pool = pool_factor(grid * grid, proj.image_tokens, square=True)
    return (grid, image_pool, (grid // image_pool) ** 2, *audio_pooling(model_cfg, pre))


def audio_pooling(model_cfg, pre):
    """(audio pooling, audio tokens): the runs of encoder tokens averaged into one, and the tokens one clip of
    pre.max_audio_frames takes in the decoder's sequence (model.projector.audio_tokens at most)."""
    pool = pool_factor(pre.max_audio_frames // 2, model_cfg.projector.audio_tokens, square=False)
    return pool, pre.max_audio_frames // 2 // pool


def pooled_audio(audio_tokens, token_mask, pool: int):
    """Audio states (B, T/2, width) and their mask (B, T/2) -> (B, T/2 / pool, width): runs of `pool` tokens
    averaged over their valid ones (zeros past the clip). Both generative models' speech goes through it."""
    if pool == 1:
        return audio_tokens
    batch, count = audio_tokens.shape[0], audio_tokens.shape[1] // pool
    runs = ops.reshape(audio_tokens * ops.expand_dims(token_mask, 2), (batch, count, pool, -1))
    counts = ops.reshape(token_mask, (batch, count, pool)).sum(axis=2, keepdims=True)
    return runs.sum(axis=2) / ops.maximum(counts, 1.0)


class Projector(nn.Cell):
    """Encoder states -> decoder-width tokens: Linear, GELU, Linear (LLaVA's mlp2x_gelu)."""

    def __init__(self, in_width: int, out_width: int, hidden: int = 0):
        super().__init__()
        hidden = hidden or out_width
        self.fc1 = dense(in_width, hidden)
        self.act = create_activation("gelu")
        self.fc2 = dense(hidden, out_width)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MultimodalLM(nn.Cell):
    """construct(ids, segment, positions, slot_index, label_index, image, mel, frame_mask) -> logits
    (L, vocab) at the labelled positions. Layouts (mindvl.data.reading.conversation_packing packs them):

      ids, segment, positions (R, S) int32   packed conversations: token ids (pad at modality slots),
                                             1, 2, ... per conversation (0 at padding), positions
                                             restarting at 0 per conversation
      slot_index (R, S) int32                per position, its row in the modality table
                                             [B images' tokens | B clips' tokens | a zero row]: the
                                             projected token written there, or the zero row's index
                                             (text and padding keep their embeddings)
      label_index (L,) int32                 flattened positions (r * S + s) whose next token is learnt
      image (B, 3, H, W) float32, mel (B, n_mels, T), frame_mask (B, T)
                                             the batch's attachments (zeros where a sample has none)
    """

    def __init__(self, model_cfg, pre, cache_len: int = 0):
        super().__init__()
        dec = model_cfg.decoder
        self.vision = VisionEncoder(model_cfg.vision, pre.image_size, model_cfg.dropout)
        self.audio = AudioEncoder(model_cfg.audio, pre.n_mels, pre.max_audio_frames, model_cfg.dropout)
        self.decoder = CausalLM(dec, cache_len)
        self.grid, self.image_pool, self.image_tokens, self.audio_pool, self.audio_tokens = modality_tokens(model_cfg, pre)
        self.image_concat = model_cfg.projector.image_merge == "concat"  # a block's patches side by side
        merged = self.image_pool ** 2 if self.image_concat else 1
        self.image_proj = Projector(model_cfg.vision.width * merged, dec.width, model_cfg.projector.hidden)
        self.audio_proj = Projector(model_cfg.audio.width, dec.width, model_cfg.projector.hidden)
        self.width = dec.width
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.concat = ops.Concat(axis=0)
        self.slots = SlotWriter()

    # -- each modality's tokens in the decoder's width ----------------------------------------------
    def image_states(self, image_tokens):
        """Vision states (B, 1 + N, width) -> (B, image_tokens, decoder width): the CLS dropped, each image_pool x
        image_pool block of patches averaged (projector.image_merge "mean") or its states concatenated row by row
        ("concat"), projected."""
        batch, k, side = image_tokens.shape[0], self.image_pool, self.grid // self.image_pool
        patches = image_tokens[:, 1:]
        if k > 1:
            grid = self.reshape(patches, (batch, side, k, side, k, -1))
            if self.image_concat:
                blocks = self.transpose(grid, (0, 1, 3, 2, 4, 5))  # (B, side, side, k, k, width)
                patches = self.reshape(blocks, (batch, side * side, -1))
            else:
                patches = self.reshape(grid.mean(axis=(2, 4)), (batch, side * side, -1))
        return self.image_proj(patches)

    def audio_states(self, audio_tokens, token_mask):
        """Audio states (B, T/2, width) and their mask (B, T/2) -> (B, audio_tokens, decoder width): runs of
        audio_pool tokens averaged over their valid ones (pooled_audio), projected."""
        return self.audio_proj(pooled_audio(audio_tokens, token_mask, self.audio_pool))

    def encode(self, image, mel, frame_mask):
        """The attachments -> (image tokens (B, image_tokens, width), audio tokens (B, audio_tokens, width))."""
        vision_tokens, _ = self.vision(image)
        audio_tokens, token_mask, _ = self.audio(mel, frame_mask)
        return self.image_states(vision_tokens), self.audio_states(audio_tokens, token_mask)

    def embed(self, ids, slot_index, image_tokens, audio_tokens):
        """Token embeddings with the modality tokens written into their slots -> (R, S, width)."""
        table = self.concat((self.reshape(image_tokens, (-1, self.width)), self.reshape(audio_tokens, (-1, self.width))))
        return self.slots(self.decoder.embed_tokens(ids), table, slot_index)

    # -- training graph ------------------------------------------------------------------------------
    def construct(self, ids, segment, positions, slot_index, label_index, image, mel, frame_mask):
        image_tokens, audio_tokens = self.encode(image, mel, frame_mask)
        return self.from_states(ids, segment, positions, slot_index, label_index, image_tokens, audio_tokens)

    def construct_from_tokens(self, ids, segment, positions, slot_index, label_index, vision_tokens, audio_tokens,
                              frame_mask):
        """`construct` from the frozen encoders' cached outputs (mindvl.pretrained.tokens): vision_tokens
        (B, 1 + N, vision width), audio_tokens (B, T/2, audio width) zero past each clip, frame_mask (B, T).
        Pooling and projection run here, so the outputs are `construct`'s; the training graph then holds
        only the projectors and the decoder (cells.model.TokenInputModel wraps it)."""
        return self.from_states(ids, segment, positions, slot_index, label_index, self.image_states(vision_tokens),
                                self.audio_states(audio_tokens, self.audio.token_mask(frame_mask)))

    def from_states(self, ids, segment, positions, slot_index, label_index, image_tokens, audio_tokens):
        """`construct` from the projected modality tokens."""
        x = self.embed(ids, slot_index, image_tokens, audio_tokens)
        return self.decoder.logits_at(self.decoder.packed_states(x, segment, positions), label_index)


class MultimodalPrefill(GraphEntry):
    """The prefill graph of a multimodal prompt: construct(ids, valid, slot_index, image, mel, frame_mask) ->
    CausalLM.prefill's outputs, the prompts left-padded (valid) and slot_index laid out as in
    MultimodalLM (one prompt per row, B = the rows). Decode steps are the decoder's own (cells.decoder.Decode)."""

    def __init__(self, model: MultimodalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, valid, slot_index, image, mel, frame_mask):
        image_tokens, audio_tokens = self.model.encode(image, mel, frame_mask)
        return self.model.decoder.prefill_embedded(self.model.embed(ids, slot_index, image_tokens, audio_tokens), valid)


class MultimodalLMLoss(nn.Cell):
    """Mean next-token cross-entropy over the labelled positions: construct(labels (L,) int32, weight (L,)
    float32 (1 at a real label, 0 at the bucket's padding), *the model's inputs) -> loss.

    `rank_mean` (data parallelism: mindvl.train.distributed.RankMean) turns the label count into the ranks'
    mean count, so each rank's loss is its share of the global batch's token mean (world x its sum over all
    labels): the ranks' mean gradient, which the gradient reducer takes, is then exactly the global token
    mean's, however unevenly the labels fall on the ranks. The count carries no gradient."""

    def __init__(self, model: MultimodalLM, rank_mean: nn.Cell = None):
        super().__init__(auto_prefix=False)
        self.model = model
        self.rank_mean = rank_mean
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, labels, weight, *inputs):
        per_token = self.ce(self.model(*inputs), labels)
        count = ops.stop_gradient(weight.sum())
        if self.rank_mean is not None:
            count = self.rank_mean(count)
        # a count of 0 has a sum of 0; a mean count is a multiple of 1/world, above this floor
        return (per_token * weight).sum() / ops.maximum(count, 1e-6)
