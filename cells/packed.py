"""Reading per-sample tokens back out of packed rows (layouts: mindvl/data/reading/packing.py).

Packed rows hold several samples each; the model wants one sample's tokens in a fixed per-sample table.
The packer gives, for every slot of that table, the flattened row position (r * S + s) its token sits
at, and one position past the end, `rows * S`, for a slot the sample does not have (a short text, a
short clip): that position reads a row of zeros appended here, so those slots are zero, finite, and
never leak another sample's tokens.
"""
from mindspore import ops


def gather_tokens(rows, index):
    """rows (R, S, width), index (...) int32 in [0, R * S] -> (..., width); index R * S reads zeros."""
    width = rows.shape[2]
    flat = ops.reshape(rows, (-1, width))  # (R * S, width)
    table = ops.concat((flat, ops.zeros_like(flat[:1])), 0)  # (R * S + 1, width)
    return ops.gather(table, index, 0)


def slot_valid(rows, index):
    """float32 {1, 0} of index's shape: 1 where index names a token of `rows` (R, S, ...), 0 at the zero row."""
    return ops.cast(index < rows.shape[0] * rows.shape[1], rows.dtype)
