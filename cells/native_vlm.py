"""A native-resolution VLM (Qwen2-VL, Qwen2.5-VL, or DINOv2 over a converted decoder): the vision tower's merged
tokens written into the prompt's image and video slots, a CausalLM (M-RoPE or 1-D positions) over them; with an
audio encoder (model.native.audio: Whisper's, as the fixed-resolution MultimodalLM hears) each clip's pooled,
projected tokens written into its audio slots too.

Children (and so checkpoint keys): tower. (cells.native_vision's), decoder. (CausalLM's), and when it hears audio.
and audio_proj. (MultimodalLM's names, so the speech side reads the same converted folder and record).
`NativePrefill` is the prefill graph of a batch of left-padded prompts (one per row) whose images are packed on
one vision sequence; the decode steps are the decoder's own (cells.decoder.Decode), each token at its index plus
the prompt's M-RoPE delta on every axis.

The slot table a batch's slot_index points into: [the packed images' merged tokens (T, the vision inputs'
capacity) | each row's clip's tokens (B x audio_tokens, when it hears) | a zero row]; the zero row's index (T, or
T + B x audio_tokens) marks text.
"""
from mindspore import nn, ops

from .decoder import CausalLM
from .graph_entry import GraphEntry
from .multimodal_lm import Projector, pooled_audio
from .slots import SlotWriter


class NativeVLM(nn.Cell):
    """construct(ids, segment, positions, slot_index, label_index, *attachments) -> logits (L, vocab) at the
    labelled positions: packed conversations as MultimodalLM takes them (mindvl.data.reading.native_packing lays
    them out), positions (R, S, 3) M-RoPE (or (R, S) for a 1-D decoder), slot_index into the slot table (module
    docstring); attachments: when it hears, mel (B, n_mels, T) and frame_mask (B, T) first (zeros for a row
    without a clip); then the tower's inputs (the images packed as engine.vision_layout's packing for the tower
    says: NativeVisionTower's five, ViTTower's four).

    audio: an AudioEncoder (None: the model reads images only); audio_pool: the runs of its tokens averaged into
    one (cells.multimodal_lm.audio_pooling); projector_hidden: the audio projector's hidden width (0: the
    decoder's)."""

    def __init__(self, tower: nn.Cell, decoder: CausalLM, audio: nn.Cell = None, audio_pool: int = 1,
                 projector_hidden: int = 0):
        super().__init__()
        self.tower = tower
        self.decoder = decoder
        self.hears = audio is not None
        self.audio_tokens = 0
        if self.hears:
            self.audio = audio
            self.audio_proj = Projector(audio.width, decoder.cfg.width, projector_hidden)
            self.audio_pool = int(audio_pool)
            self.audio_tokens = audio.max_frames // 2 // self.audio_pool
        self.slots = SlotWriter()
        self.concat = ops.Concat(axis=0)

    def speech(self, mel, frame_mask):
        """A batch's clips -> (B, audio_tokens, decoder width): each clip's tokens."""
        states, token_mask, _ = self.audio(mel, frame_mask)
        return self.speech_from_states(states, token_mask)

    def speech_from_states(self, states, token_mask):
        """The audio encoder's states (B, T/2, width), zero past each clip, and their mask -> speech's tokens."""
        return self.audio_proj(pooled_audio(states, token_mask, self.audio_pool))

    def table(self, vision_tokens, speech_tokens):
        """The slot table's rows before its zero row: the vision tokens (T, width), then each clip's (B, A, width)."""
        return self.concat((vision_tokens, ops.reshape(speech_tokens, (-1, vision_tokens.shape[1]))))

    def embed(self, ids, slot_index, *attachments):
        """ids (rows, seq) embedded, each slot (slot_index below the table's zero row) holding its token."""
        if self.hears:
            return self.fill(ids, self.table(self.tower(*attachments[2:])[0],
                                             self.speech(attachments[0], attachments[1])), slot_index)
        return self.fill(ids, self.tower(*attachments)[0], slot_index)

    def construct(self, ids, segment, positions, slot_index, label_index, *attachments):
        return self.from_embedded(self.embed(ids, slot_index, *attachments), segment, positions, label_index)

    def construct_from_tokens(self, ids, segment, positions, slot_index, label_index, audio_states, frame_mask,
                              *vision):
        """`construct` of a model that hears, from the frozen audio encoder's cached states (mindvl.pretrained.
        tokens: audio_states (B, T/2, width), zero past each clip) in place of the mel; the tower runs (its
        tokens are not cached). The training graph then holds no audio encoder (cells.TokenInputModel wraps it)."""
        speech = self.speech_from_states(audio_states, self.audio.token_mask(frame_mask))
        x = self.fill(ids, self.table(self.tower(*vision)[0], speech), slot_index)
        return self.from_embedded(x, segment, positions, label_index)

    def from_embedded(self, x, segment, positions, label_index):
        return self.decoder.logits_at(self.decoder.packed_states(x, segment, positions), label_index)

    def fill(self, ids, tokens, slot_index):
        """ids (rows, seq) embedded, slot (r, s) holding tokens[slot_index[r, s]] (T, width) where it is < T."""
        return self.slots(self.decoder.embed_tokens(ids), tokens, slot_index)


class NativePrefill(GraphEntry):
    """construct(ids, valid, positions, slot_index, *attachments) -> CausalLM.prefill's outputs: positions (rows,
    seq, 3) M-RoPE (or (rows, seq)), slot_index (rows, seq) into the slot table, the attachments as NativeVLM
    takes them."""

    def __init__(self, model: NativeVLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, valid, positions, slot_index, *attachments):
        x = self.model.embed(ids, slot_index, *attachments)
        return self.model.decoder.prefill_embedded(x, valid, positions)
