"""Whisper-encoder-layout audio encoder over log-mel features.

Two Conv1d + GELU (the second halves time), fixed sinusoidal positions, pre-LN blocks, final
LayerNorm. Padding is made harmless rather than merely ignored: the mel is zeroed at padded frames
(whatever the loader padded with), so a valid token's output depends on valid frames only and is the
same in a padded batch and alone; the token mask is the frame mask at even frames (token i is centred
on frame 2i of the stride-2 conv, whose receptive field beyond the last valid frame sees only zeros).
"""
from mindspore import Tensor, nn, ops

from .activation import create_activation
from .linear import Conv1dMatMul
from .embedding import sinusoids
from .masks import padding_mask
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
        self.conv1 = Conv1dMatMul(n_mels, cfg.width, kernel=3, stride=1, padding=1)
        self.act1 = create_activation(cfg.activation)
        self.conv2 = Conv1dMatMul(cfg.width, cfg.width, kernel=3, stride=2, padding=1)
        self.act2 = create_activation(cfg.activation)
        self.positions = Tensor(sinusoids(max_frames // 2, cfg.width))  # (max_frames/2, width)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.encoder = TransformerStack(cfg, dropout)
        self.mul = ops.Mul()
        self.add = ops.Add()
        self.transpose = ops.Transpose()
        self.expand_dims = ops.ExpandDims()
        self.reduce_sum = ops.ReduceSum()
        self.maximum = ops.Maximum()
        self.div = ops.Div()

    def construct(self, mel, frame_mask):
        frames = self.expand_dims(frame_mask, 1)  # (batch, 1, T)
        x = self.transpose(self.mul(mel, frames), (0, 2, 1))  # (batch, T, n_mels)
        x = self.act1(self.conv1(x))  # (batch, T, width)
        x = self.act2(self.conv2(x))  # (batch, T/2, width)
        token_mask = frame_mask[:, ::2]  # (batch, T/2)
        x = self.dropout(self.add(x, self.positions[:x.shape[1]]))
        x = self.encoder(x, padding_mask(token_mask))
        weights = self.expand_dims(token_mask, 2)  # (batch, T/2, 1)
        count = self.maximum(self.reduce_sum(weights, 1), 1.0)  # (batch, 1)
        pooled = self.div(self.reduce_sum(self.mul(x, weights), 1), count)
        return x, token_mask, pooled
