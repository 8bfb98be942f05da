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


CUBIC_A = -0.75  # PyTorch's and ONNX's bicubic kernel (MindSpore's ResizeBicubic uses -0.5 with half pixels)


def _cubic_matrix(size_in: int, size_out: int) -> np.ndarray:
    """(size_out, size_in) weights of a 1-D bicubic resize, align_corners=False, borders clamped: what
    torch.nn.functional.interpolate(mode="bicubic") computes along one axis."""
    def near(x):  # |x| <= 1
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    matrix = np.zeros((size_out, size_in), np.float64)
    for out in range(size_out):
        real = (out + 0.5) * size_in / size_out - 0.5
        base = int(np.floor(real))
        t = real - base
        for offset, weight in zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t))):
            matrix[out, min(max(base + offset, 0), size_in - 1)] += weight
    return matrix


def resize_positions(pos_embed, grid_in: int, grid_out: int) -> np.ndarray:
    """ViT position table (1, 1 + grid_in^2, width) -> (1, 1 + grid_out^2, width): the CLS position kept,
    the patch grid resized bicubically (DINOv2's interpolation) so a model runs at another resolution.
    Done once on the weights, in float64, rather than in the graph: the image size is static."""
    pos = np.asarray(pos_embed, np.float64)
    width = pos.shape[-1]
    if pos.shape != (1, 1 + grid_in * grid_in, width):
        raise ValueError(f"position table of shape {pos.shape} does not hold 1 + {grid_in}x{grid_in} positions")
    grid = pos[0, 1:].reshape(grid_in, grid_in, width)
    resize = _cubic_matrix(grid_in, grid_out)
    resized = np.einsum("ai,ijc,bj->abc", resize, grid, resize).reshape(1, grid_out * grid_out, width)
    return np.concatenate([pos[:, :1], resized], axis=1).astype(np.float32)


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
