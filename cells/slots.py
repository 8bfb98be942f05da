"""Tokens written into their slots of a sequence's embeddings: how every multimodal model puts its image (and
audio) tokens into the decoder's input, where the prompt left a slot per token."""
from mindspore import nn, ops


class SlotWriter(nn.Cell):
    """text (rows, seq, width) embeddings, tokens (T, width), slot_index (rows, seq) int32 -> (rows, seq, width):
    position (r, s) takes tokens[slot_index[r, s]] where slot_index < T, its text embedding where it is T (the
    zero row appended to the table)."""

    def __init__(self):
        super().__init__()
        self.concat = ops.Concat(axis=0)
        self.gather = ops.Gather()
        self.select = ops.Select()
        self.expand = ops.ExpandDims()

    def construct(self, text, tokens, slot_index):
        slots = tokens.shape[0]
        table = self.concat((tokens, ops.zeros((1, tokens.shape[1]), tokens.dtype)))
        is_slot = ops.broadcast_to(self.expand(slot_index < slots, 2), text.shape)
        return self.select(is_slot, self.gather(table, slot_index, 0), text)
