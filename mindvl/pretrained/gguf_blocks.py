"""A GGUF tensor's quantized blocks in mindvl's int8 / int4 layouts (cells/quant.py), exactly and without widening
the tensor to float32: what `mindvl convert llm --weights gguf` stores.

  Q8_0, Q5_0  q * d per block of 32               -> int8, one scale per 32 inputs
  Q6_K        q * (d * scale) per 16 of a 256 block -> int8, one scale per 16 inputs
  Q4_0        (q - 8) * d per block of 32            -> int4 with scale d, minimum -8 d
  Q4_K        q * (d * sc) - dmin * m per 32 of 256  -> int4 with scale d * sc, minimum -dmin * m
The gguf package unpacks the bits: each block's float16 factor d (and dmin) is set to 1 (0) in a copy of the
blocks, so its dequantizer returns the integers (times the sub-block scales, which its helpers read), and the
factors are taken from the block headers. Every widened value equals the gguf package's own dequantization.
Another quantization (Q5_K, Q2_K, the IQ types) returns None: the caller widens that tensor and quantizes it.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

ONE, ZERO = np.array([1], np.float16).view(np.uint8), np.array([0], np.float16).view(np.uint8)
K_BLOCK = 256  # a K-quant's super-block


def _with_factors(blocks: np.ndarray, ones=(), zeros=()) -> np.ndarray:
    """A copy of the blocks whose float16 factors at byte offsets `ones` read 1 and at `zeros` read 0."""
    unit = blocks.copy()
    for offset in ones:
        unit[:, offset:offset + 2] = ONE
    for offset in zeros:
        unit[:, offset:offset + 2] = ZERO
    return unit


def _factor(blocks: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view(np.float16).astype(np.float32)[:, 0]


def gguf_layout(data: np.ndarray, qtype) -> Optional[Dict[str, np.ndarray]]:
    """A GGUF tensor's data (rows, bytes a row) of quantization `qtype` as {"weight_int8", "weight_scale"} or
    {"weight_int4", "weight_scale", "weight_min"} of (rows, inputs) weights; None for another quantization."""
    import gguf

    from mindvl.cells.quant import pack_int4

    kinds = gguf.GGMLQuantizationType
    if qtype not in (kinds.Q8_0, kinds.Q5_0, kinds.Q6_K, kinds.Q4_0, kinds.Q4_K):
        return None
    rows = data.shape[0]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(-1, type_size)
    quant = gguf.quants
    if qtype in (kinds.Q8_0, kinds.Q5_0, kinds.Q4_0):
        d = _factor(blocks, 0)
        q = getattr(quant, qtype.name).dequantize_blocks(_with_factors(blocks, ones=(0,))).astype(np.int8)
        if qtype != kinds.Q4_0:
            return {"weight_int8": q.reshape(rows, -1), "weight_scale": d.reshape(rows, -1)}
        unsigned = (q + 8).astype(np.uint8).reshape(rows, -1)
        return {"weight_int4": pack_int4(unsigned), "weight_scale": d.reshape(rows, -1),
                "weight_min": (-8 * d).reshape(rows, -1)}
    if qtype == kinds.Q6_K:  # ql (128 bytes), qh (64), 16 int8 scales, d
        scales_at, d_at = K_BLOCK // 2 + K_BLOCK // 4, type_size - 2
        scales = blocks[:, scales_at:scales_at + K_BLOCK // 16].view(np.int8).astype(np.float32)
        scaled = quant.Q6_K.dequantize_blocks(_with_factors(blocks, ones=(d_at,))).reshape(-1, K_BLOCK // 16, 16)
        q = np.divide(scaled, scales[..., None], out=np.zeros_like(scaled), where=scales[..., None] != 0)
        return {"weight_int8": np.rint(q).astype(np.int8).reshape(rows, -1),
                "weight_scale": (_factor(blocks, d_at)[:, None] * scales).reshape(rows, -1)}
    # Q4_K: d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles
    sc, m = (part.astype(np.float32) for part in quant.Q4_K.get_scale_min(blocks[:, 4:16]))
    scaled = quant.Q4_K.dequantize_blocks(_with_factors(blocks, ones=(0,), zeros=(2,))).reshape(-1, 8, 32)
    q = np.divide(scaled, sc[..., None], out=np.zeros_like(scaled), where=sc[..., None] != 0)
    return {"weight_int4": pack_int4(np.rint(q).astype(np.uint8).reshape(rows, -1)),
            "weight_scale": (_factor(blocks, 0)[:, None] * sc).reshape(rows, -1),
            "weight_min": (-_factor(blocks, 2)[:, None] * m).reshape(rows, -1)}
