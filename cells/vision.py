"""ViT image encoder.

The patch embedding is a Dense (MatMul) over unfolded patches rather than a strided Conv2d: the same
arithmetic, but a MatMul shards and runs well on every backend. `conv_weight_to_matmul` converts a
pretrained Conv2d patch weight (width, 3, p, p) to this layout; patches are flattened channel-major
(3, p, p), so the conversion is a reshape.
"""
import numpy as np

from mindspore import Tensor, nn, ops

from .embedding import learned_tokens
from .linear import dense
from .transformer import TransformerStack


def conv_weight_to_matmul(weight) -> np.ndarray:
    """Conv2d patch weight (width, 3, p, p) -> Dense weight (width, 3*p*p) for `VisionEncoder.patch_embed`."""
    weight = np.asarray(weight.asnumpy() if isinstance(weight, Tensor) else weight, dtype=np.float32)
    if weight.ndim != 4:
        raise ValueError(f"expected a Conv2d weight (out, in, p, p), got shape {weight.shape}")
    return weight.reshape(weight.shape[0], -1)


class VisionEncoder(nn.Cell):
    """image (batch, 3, H, W) float32 normalised, H = W = image_size ->
    (tokens (batch, 1 + N, width) with the CLS token first, pooled (batch, width) = CLS output),
    N = (image_size / patch_size)^2.

    Checkpoint keys: patch_embed.{weight,bias}, cls_token, pos_embed, encoder.blocks.i.…, encoder.norm.
    """

    def __init__(self, cfg, image_size: int, dropout: float = 0.0):
        super().__init__()
        patch = cfg.patch_size
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not divisible by patch_size {patch}")
        self.patch_size = patch
        self.grid = image_size // patch
        self.num_patches = self.grid * self.grid
        self.width = cfg.width
        self.patch_embed = dense(3 * patch * patch, cfg.width)
        self.cls_token = learned_tokens(1, 1, cfg.width)
        self.pos_embed = learned_tokens(1, 1 + self.num_patches, cfg.width)
        self.encoder = TransformerStack(cfg, dropout)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.concat = ops.Concat(axis=1)
        self.tile = ops.Tile()
        self.add = ops.Add()

    def patchify(self, image):
        """(batch, 3, H, W) -> (batch, N, 3*p*p), patches row-major, each flattened as (3, p, p)."""
        g, p = self.grid, self.patch_size
        x = self.reshape(image, (-1, 3, g, p, g, p))  # (batch, 3, gh, p, gw, p)
        x = self.transpose(x, (0, 2, 4, 1, 3, 5))  # (batch, gh, gw, 3, p, p)
        return self.reshape(x, (-1, self.num_patches, 3 * p * p))

    def load_conv_patch_weight(self, weight, bias=None) -> None:
        """Load a pretrained Conv2d patch embedding ((width, 3, p, p) weight, (width,) bias)."""
        self.patch_embed.weight.set_data(Tensor(conv_weight_to_matmul(weight)))
        if bias is not None:
            self.patch_embed.bias.set_data(Tensor(np.asarray(bias, np.float32)))

    def construct(self, image):
        patches = self.patch_embed(self.patchify(image))  # (batch, N, width)
        cls = self.tile(self.cls_token, (image.shape[0], 1, 1))  # (batch, 1, width)
        x = self.dropout(self.add(self.concat((cls, patches)), self.pos_embed))
        x = self.encoder(x, None)
        return x, x[:, 0]
