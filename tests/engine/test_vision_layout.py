"""PackedViTLayout: images of their own sizes for a ViT with a CLS token and a square position table (DINOv2),
laid out on the host (the graph's parity with transformers is tests/pretrained/test_dinov2.py's)."""
import numpy as np
import pytest

from mindvl.engine.vision_layout import packed_vit_layout
from mindvl.errors import InputError


def test_each_image_is_its_cls_row_then_its_patches_with_interpolation_weights():
    layout = packed_vit_layout([(4, 6), (2, 2)], table=4)
    assert layout.rows == (1 + 24) + (1 + 4)
    np.testing.assert_array_equal(layout.segments, [1] * 25 + [2] * 5)
    cls_rows = [0, 25]
    np.testing.assert_array_equal(np.flatnonzero(layout.placement[:, -1]), cls_rows)
    for row in cls_rows:  # the CLS position and the CLS token, nothing of the grid
        np.testing.assert_array_equal(np.flatnonzero(layout.placement[row]), [0, 17])
    patch_rows = np.setdiff1d(np.arange(layout.rows), cls_rows)
    np.testing.assert_allclose(layout.placement[patch_rows, 1:-1].sum(1), 1.0, atol=1e-6)  # bicubic weights
    assert not layout.placement[patch_rows, 0].any()


def test_at_the_tables_own_grid_each_patch_takes_exactly_its_own_position():
    layout = packed_vit_layout([(4, 4)], table=4)
    weights = layout.placement[1:, 1:-1]
    states = np.zeros((layout.rows, 16))
    states[1:] = weights  # each patch row's weights, read back row by row: the identity
    np.testing.assert_allclose(layout.image_states(states, 0)[1:], np.eye(16), atol=1e-12)


def test_image_states_give_the_patches_row_by_row_from_merge_block_order():
    grids = [(2, 4), (4, 2)]
    layout = packed_vit_layout(grids, table=4)
    # the processor's merge-block order of a 2 x 4 grid: blocks left to right, each block's 2 x 2 row by row
    states = np.concatenate([[[-1]], np.array([0, 1, 4, 5, 2, 3, 6, 7])[:, None],
                             [[-2]], np.array([0, 1, 2, 3, 4, 5, 6, 7])[:, None]]).astype(np.float32)
    np.testing.assert_array_equal(layout.image_states(states, 0)[:, 0], [-1, 0, 1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(layout.image_states(states, 1)[:, 0], [-2, 0, 1, 2, 3, 4, 5, 6, 7])


def test_graph_inputs_put_patches_after_each_cls_row_and_pad_with_segment_zero():
    layout = packed_vit_layout([(2, 2), (2, 2)], table=2)
    patches = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) + 1
    packed, placement, segments = layout.graph_inputs(patches, bucket=12)
    assert packed.shape == (1, 12, 3) and placement.shape == (1, 12, 6) and segments.shape == (1, 12)
    np.testing.assert_array_equal(packed[0, [0, 5, 10, 11]], 0)  # CLS rows and padding hold no pixels
    np.testing.assert_array_equal(packed[0, 1:5], patches[:4])
    np.testing.assert_array_equal(packed[0, 6:10], patches[4:])
    np.testing.assert_array_equal(segments[0], [1] * 5 + [2] * 5 + [0, 0])
    assert not placement[0, 10:].any()


def test_refusals_name_the_image_and_the_bucket():
    with pytest.raises(InputError, match="image 1: a patch grid of 3x2"):
        packed_vit_layout([(2, 2), (3, 2)], table=4)
    layout = packed_vit_layout([(2, 2)], table=4)
    with pytest.raises(InputError, match="a vision bucket of 4 rows for 1 images that take 5"):
        layout.graph_inputs(np.zeros((4, 3), np.float32), bucket=4)
    with pytest.raises(InputError, match="3 patches for images of 4"):
        layout.graph_inputs(np.zeros((3, 3), np.float32))


def test_vit_packing_keeps_each_images_patch_rows_in_order_and_refuses_a_video():
    from mindvl.engine.vision_layout import ViTPacking

    packing = ViTPacking(table=4, merge=2, patch_values=3)
    grids = [(1, 2, 2), (1, 2, 4)]
    assert packing.laid_out(grids) == (1 + 4) + (1 + 8)
    attachments = [("image", np.ones((4, 3), np.float32), grids[0], 1.0),
                   ("image", np.full((8, 3), 2, np.float32), grids[1], 1.0)]
    patches, placement, segments, keep = packing.inputs(attachments, size=16, capacity=4)
    assert patches.shape == (1, 16, 3) and placement.shape == (1, 16, 18) and segments.shape == (1, 16)
    np.testing.assert_array_equal(keep, [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 0, 0, 0, 0])  # CLS rows 0 and 5
    np.testing.assert_array_equal(patches[0, keep[:12], 0], [1] * 4 + [2] * 8)
    with pytest.raises(InputError, match="attachment 0: a video .* reads images only"):
        packing.laid_out([(2, 2, 2)])
