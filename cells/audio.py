"""Whisper-encoder-layout audio encoder over log-mel features.

Two Conv1d + GELU (the second halves time), fixed sinusoidal positions, pre-LN blocks, final
LayerNorm. Padding is made harmless rather than merely ignored: the mel is zeroed at padded frames
(whatever the loader padded with) and so is the first conv's output, so a valid token's output depends
on its clip's frames only, exactly as if zeros surrounded the clip. That is what lets several clips share
a row (`construct_packed`, training): a clip at an even frame offset with a zero frame after it computes
the same tokens as alone (mindvl/data/reading/packing.py lays the rows out). Token i is centred on frame 2i of
the stride-2 conv, so the token mask is the frame mask at even frames.

The positions are Whisper's sinusoids rounded to float16, the table the published Whisper checkpoints
hold (OpenAI released float16 weights; the CTranslate2 copy keeps those values). The rounding moves a
value by at most 2.4e-4, yet with Whisper-base's weights the exact float32 table moves the final states
by up to 5e-3 on speech and 0.4 on padded frames; a model trained from scratch learns with either.
"""
import numpy as np
from mindspore import Tensor, nn, ops

from .activation import create_activation
from .embedding import sinusoids
from .linear import Conv1dMatMul
from .masks import padding_mask, segment_mask
from .packed import gather_tokens, slot_valid
from .pooling import MaskedMean
from .transformer import TransformerStack


class AudioEncoder(nn.Cell):
    """mel (batch, n_mels, T) float32, frame_mask (batch, T) float32 {1 frame, 0 pad}; T even, <= max_frames
    -> (tokens (batch, T/2, width), token_mask (batch, T/2), pooled (batch, width) = mean of valid tokens).

    Checkpoint keys: conv1, conv2 (`.weight` (out, in, 3) as Whisper's Conv1d, `.bias`), encoder.blocks.i.…, encoder.norm.
    The positions are a constant, not a parameter.
    """

    def __init__(self, cfg, n_mels: int, max_frames: int, dropout: float = 0.0):
        super().__init__()
        if max_frames % 2:
            raise ValueError(f"max_frames must be even (the encoder halves time), got {max_frames}")
        self.width = cfg.width
        self.max_frames = max_frames
        self.conv1 = Conv1dMatMul(n_mels, cfg.width, kernel=3, stride=1, padding=1)
        self.act1 = create_activation(cfg.activation)
        self.conv2 = Conv1dMatMul(cfg.width, cfg.width, kernel=3, stride=2, padding=1)
        self.act2 = create_activation(cfg.activation)
        table = sinusoids(max_frames // 2, cfg.width).astype(np.float16).astype(np.float32)  # see the docstring
        self.positions = Tensor(table)  # (max_frames/2, width)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.encoder = TransformerStack(cfg, dropout)
        self.pool = MaskedMean()
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.transpose = ops.Transpose()
        self.expand_dims = ops.ExpandDims()
        self.gather = ops.Gather()

    def _front(self, mel, frame_valid):
        """mel (rows, n_mels, T), frame_valid (rows, T) float {1, 0} -> conv tokens (rows, T/2, width).

        Both convs see zeros wherever frame_valid is 0: the mel is zeroed there and so is conv1's output,
        so conv2's window at a clip's edge reads what its own zero padding would give."""
        x = self.transpose(self.mul(mel, self.expand_dims(frame_valid, 1)), (0, 2, 1))  # (rows, T, n_mels)
        x = self.mul(self.act1(self.conv1(x)), self.expand_dims(frame_valid, 2))  # (rows, T, width)
        return self.act2(self.conv2(x))  # (rows, T/2, width)

    def construct(self, mel, frame_mask):
        x = self._front(mel, frame_mask)
        token_mask = self.token_mask(frame_mask)  # (batch, T/2)
        x = self.dropout(self.add(x, self.positions[:x.shape[1]]))
        x = self.encoder(x, padding_mask(token_mask))
        return x, token_mask, self.pool(x, token_mask)

    def token_mask(self, frame_mask):
        """(batch, T) frame mask -> (batch, T/2) token mask: token i is centred on frame 2i."""
        return frame_mask[:, ::2]

    def construct_packed(self, mel, frame_segment, positions, index):
        """Packed rows of clips -> per-clip outputs, equal to `construct` on each clip alone.

        mel (R, n_mels, T) float32: clips at even frame offsets, each followed by at least one zero frame
        (or the row's end); frame_segment (R, T) int32: 1.. per clip at its frames, 0 elsewhere;
        positions (R, T/2) int32: each token's position within its clip; index (B, Na) int32: the
        flattened token position (r * T/2 + i) of token j of clip b, R * T/2 where clip b has no token j.
        Returns (tokens (B, Na, width), zero where a clip has no token; pooled (B, width)).
        """
        frame_valid = ops.cast(frame_segment > 0, mel.dtype)
        x = self._front(mel, frame_valid)
        x = self.dropout(self.add(x, self.gather(self.positions, positions, 0)))
        x = self.encoder(x, segment_mask(frame_segment[:, ::2]))  # token i <-> frame 2i
        tokens = gather_tokens(x, index)
        return tokens, self.pool(tokens, slot_valid(x, index))
