"""A native-resolution VLM (Qwen2-VL, Qwen2.5-VL): the vision tower's merged tokens written into the prompt's
image and video slots, a CausalLM with M-RoPE over them.

Children (and so checkpoint keys): tower. (cells.native_vision.NativeVisionTower's), decoder. (CausalLM's).
`NativePrefill` is the prefill graph of a batch of left-padded prompts (one per row) whose images are packed on
one vision sequence; the decode steps are the decoder's own (cells.decoder.Decode), each token at its index plus
the prompt's M-RoPE delta on every axis.
"""
from mindspore import nn

from .decoder import CausalLM
from .native_vision import NativeVisionTower
from .slots import SlotWriter


class NativeVLM(nn.Cell):
    """construct(ids, segment, positions, slot_index, label_index, *vision) -> logits (L, vocab) at the labelled
    positions: packed conversations as MultimodalLM takes them (mindvl.data.reading.native_packing lays them out),
    positions (R, S, 3) M-RoPE (or (R, S) for a 1-D decoder), slot_index into the batch's images' merged tokens
    (their count: not a slot), `vision` the tower's inputs (the images packed as engine.vision_layout's packing for
    the tower says: NativeVisionTower's five, ViTTower's four)."""

    def __init__(self, tower: NativeVisionTower, decoder: CausalLM):
        super().__init__()
        self.tower = tower
        self.decoder = decoder
        self.slots = SlotWriter()

    def embed(self, ids, slot_index, *vision):
        """ids (rows, seq) embedded, each slot (slot_index < the batch's vision tokens) holding its vision token."""
        return self.fill(ids, self.tower(*vision)[0], slot_index)

    def construct(self, ids, segment, positions, slot_index, label_index, *vision):
        x = self.embed(ids, slot_index, *vision)
        return self.decoder.logits_at(self.decoder.packed_states(x, segment, positions), label_index)

    def fill(self, ids, vision_tokens, slot_index):
        """ids (rows, seq) embedded, slot (r, s) holding vision_tokens[slot_index[r, s]] (T, width) where it is < T."""
        return self.slots(self.decoder.embed_tokens(ids), vision_tokens, slot_index)


class NativePrefill(nn.Cell):
    """construct(ids, valid, positions, slot_index, *vision) -> CausalLM.prefill's outputs: positions (rows, seq, 3)
    M-RoPE (or (rows, seq)), slot_index (rows, seq) into the packed images' tokens (their count: not a slot), the
    tower's inputs (NativeVLM's `vision`)."""

    def __init__(self, model: NativeVLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, valid, positions, slot_index, *vision):
        x = self.model.embed(ids, slot_index, *vision)
        return self.model.decoder.prefill_embedded(x, valid, positions)
