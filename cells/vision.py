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
from .masks import segment_mask
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
        return x, self.pooled(x)

    def pooled(self, tokens):
        """(batch, 1 + N, width) -> (batch, width): the CLS token's state (also of cached states)."""
        return tokens[:, 0]


class PackedViT(VisionEncoder):
    """A VisionEncoder (DINOv2) at native resolution: images of any sizes (multiples of the patch) packed along one
    sequence, each as its CLS row and its patches, attending only within itself.

    patches (1, S, 3*p*p) float32 (zeros at CLS and padding rows), placement (1, S, 2 + grid^2) float32, segments
    (1, S) int32 (1.. the image a row belongs to, 0 padding) -> states (1, S, width) after the final norm.

    `placement` is computed on the host (mindvl.engine.vision_layout.PackedViTLayout): a patch row holds its
    bicubic weights over the position table (the table interpolated to its image's grid, as DINOv2 does for a
    size it was not trained at), a CLS row the CLS position and, in its last column, the CLS token. So one
    static graph serves every mix of image sizes in its bucket, the interpolation is a MatMul with the position
    table (which stays a trainable Parameter), and the checkpoint keys are VisionEncoder's at the table's own
    resolution (the converted folder loads unchanged).
    """

    def __init__(self, cfg, grid: int, dropout: float = 0.0):
        super().__init__(cfg, grid * cfg.patch_size, dropout)
        self.matmul = ops.BatchMatMul()

    def construct(self, patches, placement, segments):
        table = self.concat((self.pos_embed, self.cls_token))  # (1, 2 + grid^2, width): CLS token last
        is_cls = placement[:, :, -1:]
        x = self.add(self.patch_embed(patches) * (1.0 - is_cls), self.matmul(placement, table))
        return self.encoder(self.dropout(x), segment_mask(segments))
