"""ViTTower: a ViT with a CLS token (PackedViT) as a native-resolution tower on a tiny random ViT. Images packed
together give each image's tokens alone (no attention across images or to the padding), and at the position
table's own size a token is exactly the fixed-resolution path's: the encoder's patch states of a merge x merge
block side by side (MultimodalLM's projector.image_merge "concat"), through the same projector. (The Qwen family's
NativeVisionTower: tests/pretrained/test_qwen2_vl.py, against transformers.)"""
import numpy as np
import pytest

from mindvl.config import VisionConfig
from mindvl.engine.vision_layout import ViTPacking
from mindvl.preprocess.native_resolution import IMAGE, PatchConfig, patches

PATCH, TABLE = 8, 4  # a 4 x 4 position table: 32 px images at the table's own size


@pytest.fixture(scope="module")
def tower():
    import mindspore as ms

    from mindvl.cells.native_vision import ViTTower
    from mindvl.cells.vision import PackedViT

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(3)
    cell = ViTTower(PackedViT(VisionConfig(patch_size=PATCH, width=32, layers=2, heads=2), TABLE), out_width=24)
    cell.set_train(False)
    return cell


def _attachment(height, width, seed):
    """A random normalised image of height x width pixels as an attachment (merge-block order, channel-major)."""
    frames = np.random.default_rng(seed).standard_normal((1, 3, height, width)).astype(np.float32)
    flat, grid = patches(frames, PatchConfig(patch_size=PATCH, temporal_patch_size=1))
    return IMAGE, flat, grid, 1.0


def _tokens(cell, attachments, size, capacity):
    from mindspore import Tensor

    inputs = ViTPacking(TABLE, 2, 3 * PATCH * PATCH).inputs(attachments, size, capacity)
    return cell(*(Tensor(x) for x in inputs)).asnumpy()[0]


def test_packed_images_give_each_images_tokens_alone(tower):
    square, wide = _attachment(32, 32, 0), _attachment(16, 48, 1)  # 4 + 3 merged tokens
    packed = _tokens(tower, [square, wide], size=40, capacity=10)
    assert packed.shape == (10, 24)
    np.testing.assert_allclose(packed[:4], _tokens(tower, [square], 17, 4), atol=1e-5)
    np.testing.assert_allclose(packed[4:7], _tokens(tower, [wide], 13, 3), atol=1e-5)


def test_at_the_tables_own_size_a_token_is_the_fixed_resolution_concat_merge(tower):
    from mindspore import Tensor

    from mindvl.cells.vision import VisionEncoder

    kind, flat, grid, step = _attachment(32, 32, 2)
    fixed = VisionEncoder(VisionConfig(patch_size=PATCH, width=32, layers=2, heads=2), 32)
    fixed.set_train(False)
    own = dict(tower.vit.parameters_and_names())
    for name, param in fixed.parameters_and_names():
        param.set_data(own[name].data)
    image = np.zeros((1, 3, 32, 32), np.float32)  # the patches back in place: (3, p, p) each, blocks row by row
    for index, (row, col) in enumerate([(2 * br + r, 2 * bc + c) for br in range(2) for bc in range(2)
                                        for r in range(2) for c in range(2)]):
        image[0, :, row * PATCH:(row + 1) * PATCH, col * PATCH:(col + 1) * PATCH] = flat[index].reshape(3, PATCH, PATCH)
    states = fixed(Tensor(image))[0].asnumpy()[0, 1:].reshape(2, 2, 2, 2, 32)  # (block row, r, block col, c, width)
    merged = states.transpose(0, 2, 1, 3, 4).reshape(4, 4 * 32)
    expected = tower.projector(Tensor(merged[None])).asnumpy()[0]
    np.testing.assert_allclose(_tokens(tower, [(kind, flat, grid, step)], 17, 4), expected, atol=1e-5)
