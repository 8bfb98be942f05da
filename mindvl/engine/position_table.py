"""A ViT's learned square position table at other patch grids, as DINOv2 interpolates it (bicubic): the weights of
each patch over the table, computed on the host in float64. A static resolution resizes the table once
(`resize_positions`, on the converted weights); images of their own sizes carry their patches' weights into the
graph (`vision_layout.packed_vit_layout`), which multiplies them with the table.
"""
import numpy as np


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


def position_weights(grid_in: int, height: int, width: int) -> np.ndarray:
    """(height * width, grid_in^2) float64: each patch of a height x width grid (row-major) as its weights over a
    square grid_in x grid_in position table, resized bicubically to (height, width) as DINOv2 interpolates
    (torch's interpolate(size=(height, width), mode="bicubic", align_corners=False); the identity at grid_in)."""
    return np.kron(_cubic_matrix(grid_in, height), _cubic_matrix(grid_in, width))


def resize_positions(pos_embed, grid_in: int, grid_out: int) -> np.ndarray:
    """ViT position table (1, 1 + grid_in^2, width) -> (1, 1 + grid_out^2, width): the CLS position kept,
    the patch grid resized bicubically (DINOv2's interpolation) so a model runs at another resolution.
    Done once on the weights, in float64, rather than in the graph: the image size is static."""
    pos = np.asarray(pos_embed, np.float64)
    width = pos.shape[-1]
    if pos.shape != (1, 1 + grid_in * grid_in, width):
        raise ValueError(f"position table of shape {pos.shape} does not hold 1 + {grid_in}x{grid_in} positions")
    resized = position_weights(grid_in, grid_out, grid_out) @ pos[0, 1:]
    return np.concatenate([pos[:, :1], resized[None]], axis=1).astype(np.float32)
