"""Additive attention masks.

Every attention in mindvl takes one float mask added to the scores before the softmax: 0 where a
query may look at a key, `MASK_VALUE` where it may not. -1e4 (not -inf) keeps fully masked rows free
of NaN and fits float16; exp(-1e4) underflows to exactly 0 in float32, so masked keys contribute
nothing. Masks broadcast to (batch, heads, queries, keys); we build (batch, 1, 1, keys) for padding
and (batch, 1, queries, keys) for structured (prefix-LM, segment, packed prefix-LM) masks.

These helpers are plain functions of tensors, called from `construct`, so they run in graph mode.
"""
import mindspore as ms
from mindspore import ops

MASK_VALUE = -1e4


def padding_mask(key_valid):
    """(batch, keys) float {1 valid, 0 pad} -> additive (batch, 1, 1, keys)."""
    additive = (1.0 - key_valid) * MASK_VALUE
    return ops.expand_dims(ops.expand_dims(additive, 1), 1)


def prefix_lm_mask(prefix_valid, answer_length: int):
    """Prefix-LM mask for a sequence [prefix (P tokens) | answer (A tokens)].

    prefix_valid: (batch, P) float {1 valid, 0 pad}; answer_length: A (a static int).
    Returns additive (batch, 1, P+A, P+A): every query sees the valid prefix keys; prefix queries never
    see answer keys; answer query i also sees answer keys j <= i (causal). Answer tokens are never
    masked as keys: padding only ever follows the real answer, so causality already hides it.
    """
    prefix_length = prefix_valid.shape[1]
    total = prefix_length + answer_length
    index = ops.arange(total, dtype=ms.int32)
    key_index = ops.expand_dims(index, 0)  # (1, T)
    query_index = ops.expand_dims(index, 1)  # (T, 1)
    # (T, T): a key is reachable if it is in the prefix or not after the query.
    structure = ops.logical_or(key_index < prefix_length, key_index <= query_index)
    answer_valid = ops.tile(ops.ones_like(prefix_valid[:, :1]), (1, answer_length))
    key_valid = ops.concat((prefix_valid, answer_valid), 1)  # (B, T)
    allowed = ops.cast(structure, ms.float32) * ops.expand_dims(ops.expand_dims(key_valid, 1), 1)
    return (1.0 - allowed) * MASK_VALUE


def segment_mask(segment_ids):
    """Block-diagonal mask for packed sequences.

    segment_ids: (batch, S) int32, 1..n names the packed sample a token belongs to, 0 is padding.
    Returns additive (batch, 1, S, S): a query sees only keys of its own, non-padding segment.
    A padding query sees nothing (its output is garbage and must be ignored by the caller).
    """
    return _additive(_same_segment(segment_ids))


def packed_prefix_lm_mask(segment_ids, answer_flag):
    """prefix_lm_mask for rows of packed samples (mindvl/data/reading/packing.py lays them out).

    segment_ids: (rows, S) int32, 1..n per packed sample, 0 at padding; answer_flag: (rows, S) float32,
    1 at answer tokens, 0 elsewhere. Returns additive (rows, 1, S, S): query q sees key k iff both belong
    to the same non-padding segment and k is a prefix token or k <= q. The packer puts a sample's valid
    prefix tokens before its answer tokens, so within a segment this is exactly prefix_lm_mask over the
    sample's valid tokens: prefix queries never see answers, answer i sees the prefix and answers <= i.
    A padding query sees nothing (garbage output, to be ignored).
    """
    index = ops.arange(segment_ids.shape[1], dtype=ms.int32)
    causal = ops.expand_dims(index, 0) <= ops.expand_dims(index, 1)  # (S, S): key <= query
    prefix_key = ops.expand_dims(answer_flag, 1) == 0  # (rows, 1, S)
    return _additive(ops.logical_and(_same_segment(segment_ids), ops.logical_or(prefix_key, causal)))


def _same_segment(segment_ids):
    """(batch, S) segment ids -> bool (batch, S, S): query and key share a non-padding segment."""
    keys = ops.expand_dims(segment_ids, 1)  # (B, 1, S)
    queries = ops.expand_dims(segment_ids, 2)  # (B, S, 1)
    return ops.logical_and(keys == queries, keys > 0)


def _additive(allowed):
    """bool (batch, queries, keys) -> additive float32 (batch, 1, queries, keys)."""
    return ops.expand_dims((1.0 - ops.cast(allowed, ms.float32)) * MASK_VALUE, 1)
