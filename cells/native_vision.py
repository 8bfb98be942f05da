"""The native-resolution vision tower of the Qwen2-VL / Qwen2.5-VL family: every image's patches packed along one
sequence, through the one block family, merged 2 x 2 into the language model's tokens.

    patches (1, S, 3 * 2 * 14 * 14) in window order -> patch_embed (a MatMul: the Conv3d's weight flattened)
      -> blocks with 2D rotary positions; Qwen2.5-VL: RMSNorm, SwiGLU with biases, windowed attention except in
         the full-attention layers (`full_layers`); Qwen2-VL: LayerNorm, quick-GELU MLP, full attention
      -> merger: norm, each merge x merge block's states concatenated, Linear -> GELU (erf) -> Linear
      -> gathered back to the processor's order (`restore`)

Attention never crosses an image (a frame, for video) or, in windowed layers, a window: the masks are
block-diagonal over the host's segment ids (mindvl.engine.vision_layout), which also hold the positions and the
order, so the graph has static shapes for any mix of image sizes within its bucket. With `window_row` (the host
laid each window out as a full row: vision_layout(window_rows=True)) a windowed layer runs over (windows, row)
rows, each attending within itself, and only the full-attention layers pay for the whole sequence.
"""
from mindspore import nn, ops

from .activation import GELU
from .linear import dense
from .masks import segment_mask
from .norm import create_norm
from .rotary import vision_rotary
from .transformer import TransformerBlock


class PatchMerger(nn.Cell):
    """(1, S, width) -> (1, S / merge^2, out_width): norm, merge^2 consecutive states concatenated, an MLP."""

    def __init__(self, width: int, out_width: int, merge: int = 2, norm: str = "rms", norm_eps: float = 1e-6):
        super().__init__()
        self.merged = width * merge * merge
        self.norm = create_norm(width, norm_eps, norm)
        self.fc1 = dense(self.merged, self.merged)
        self.act = GELU()
        self.fc2 = dense(self.merged, out_width)
        self.reshape = ops.Reshape()

    def construct(self, x):
        x = self.norm(x)
        x = self.reshape(x, (x.shape[0], x.shape[1] * x.shape[2] // self.merged, self.merged))
        return self.fc2(self.act(self.fc1(x)))


class NativeVisionTower(nn.Cell):
    """patches (1, S, patch_values) float32 in window order, positions (1, S, 2) int32, frames and windows (1, S)
    int32 segment ids (0: padding), restore (T,) int32 -> (1, T, out_width): each merged token in the processor's
    order (see the module docstring).

    Children (and so checkpoint keys): patch_embed, blocks.{i} (norm1, attn.{q,k,v,out}_proj, norm2, mlp.{gate,
    fc1,fc2}), merger (norm, fc1, fc2)."""

    def __init__(self, width: int, layers: int, heads: int, mlp_width: int, out_width: int, patch_values: int = 1176,
                 merge: int = 2, full_layers=(), family: str = "qwen2_5_vl", norm_eps: float = 1e-6,
                 theta: float = 10000.0, window_row: int = 0):
        super().__init__()
        if family not in ("qwen2_5_vl", "qwen2_vl"):
            raise ValueError(f"vision tower family: expected 'qwen2_5_vl' or 'qwen2_vl', got {family!r}")
        windowed = family == "qwen2_5_vl"
        norm = "rms" if windowed else "layer"
        self.full_layers = tuple(range(layers)) if not windowed else tuple(full_layers)
        self.patch_embed = dense(patch_values, width, has_bias=False)
        self.rotary = vision_rotary(width // heads, theta)
        self.blocks = nn.CellList([
            TransformerBlock(width, heads, mlp_width / width, activation="silu" if windowed else "quick_gelu",
                             norm_eps=norm_eps, norm=norm, gated_mlp=windowed, rotary=True)
            for _ in range(layers)])
        self.merger = PatchMerger(width, out_width, merge, norm, norm_eps)
        self.window_row = window_row if windowed else 0
        self.width = width
        self.gather = ops.Gather()
        self.reshape = ops.Reshape()

    def _rows(self, x):
        """(1, S, ...) -> (S / window_row, window_row, ...): one window a row."""
        return self.reshape(x, (x.shape[1] // self.window_row, self.window_row) + x.shape[2:])

    def construct(self, patches, positions, frames, windows, restore):
        x = self.patch_embed(patches)
        rotary = self.rotary(positions)
        full = segment_mask(frames)
        if self.window_row:
            windowed, window_rotary = segment_mask(self._rows(windows)), (self._rows(rotary[0]), self._rows(rotary[1]))
        else:
            windowed, window_rotary = segment_mask(windows), rotary
        for index, block in enumerate(self.blocks):
            if index in self.full_layers:
                x = block(x, full, rotary)
            elif self.window_row:
                x = self.reshape(block(self._rows(x), windowed, window_rotary), x.shape)
            else:
                x = block(x, windowed, rotary)
        return self.gather(self.merger(x), restore, 1)


class ViTTower(nn.Cell):
    """A ViT with a CLS token (cells.vision.PackedViT: DINOv2) as a native-resolution tower: patches, placement,
    segments (PackedViT's inputs), keep (T * merge^2,) int32 -> (1, T, out_width).

    `keep` gathers every image's patch rows in merge-block order (engine.vision_layout.ViTPacking), so each merge x
    merge block's states lie side by side; a block becomes one token, its states concatenated (the Qwen2-VL merger's
    order, and a generative recipe's projector.image_merge "concat") and projected by an MLP to the decoder's width.
    Children (and so checkpoint keys): vit. (the converted encoder's own keys under it), projector.
    """

    def __init__(self, vit, out_width: int, merge: int = 2, hidden: int = 0):
        from .multimodal_lm import Projector

        super().__init__()
        self.vit = vit
        self.unit = merge * merge
        self.projector = Projector(vit.width * self.unit, out_width, hidden)
        self.gather = ops.Gather()
        self.reshape = ops.Reshape()

    def construct(self, patches, placement, segments, keep):
        states = self.gather(self.vit(patches, placement, segments), keep, 1)  # (1, T * merge^2, width)
        return self.projector(self.reshape(states, (1, keep.shape[0] // self.unit, -1)))
