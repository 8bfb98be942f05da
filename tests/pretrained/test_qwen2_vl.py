"""The native-resolution vision tower of Qwen2.5-VL and Qwen2-VL against transformers on tiny random checkpoints
(tests/references/ref_qwen2_vl.py): one image (a partial window), two images of different sizes packed on one
sequence, a video of two temporal patches; also padded to a static bucket; and the host layout's windows."""
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from safetensors.numpy import load_file

from mindvl.cells.native_vision import NativeVisionTower
from mindvl.engine.vision_layout import vision_layout
from mindvl.errors import ConversionError
from mindvl.pretrained.qwen2_vl import vision_settings, vision_tensors

REFERENCES = Path(__file__).parents[1] / "references"
STORED = np.load(REFERENCES / "qwen2_vl.npz")
CASES = {"one_image": [0], "two_images": [2, 1], "video": None}


def checkpoint(family):
    folder = REFERENCES / f"tiny_{family}"
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def tower(request):
    ms.set_context(mode=ms.GRAPH_MODE)
    config, tensors = checkpoint(request.param)
    settings = vision_settings(config)
    window = settings.pop("window")
    cell = NativeVisionTower(**settings)
    unloaded = ms.load_param_into_net(cell, {k: ms.Parameter(ms.Tensor(v), name=k)
                                             for k, v in vision_tensors(tensors, config).items()}, strict_load=True)
    assert unloaded == ([], [])
    return request.param, cell, window


def case_inputs(case):
    if CASES[case] is None:
        return STORED["video_pixels"], [STORED["video_grid"][0]]
    return (np.concatenate([STORED[f"processed_{i}_pixels"] for i in CASES[case]]),
            [STORED[f"processed_{i}_grid"][0] for i in CASES[case]])


@pytest.mark.parametrize("case", CASES)
def test_the_tower_gives_transformers_merged_tokens(tower, case):
    family, cell, window = tower
    pixels, grids = case_inputs(case)
    layout = vision_layout(grids, 2, window)
    out = cell(*map(ms.Tensor, layout.graph_inputs(pixels))).asnumpy()[0]
    np.testing.assert_allclose(out, STORED[f"{family}_vision_{case}"], atol=1e-5)
    assert layout.tokens_per_item == [int(np.prod(g)) // 4 for g in grids]


def test_padding_to_a_bucket_changes_no_token(tower):
    family, cell, window = tower
    pixels, grids = case_inputs("two_images")
    layout = vision_layout(grids, 2, window)
    padded = cell(*map(ms.Tensor, layout.graph_inputs(pixels, bucket=512))).asnumpy()[0]
    np.testing.assert_allclose(padded, STORED[f"{family}_vision_two_images"], atol=1e-5)


def test_windows_stay_inside_a_frame_hold_at_most_window_squared_blocks_and_cover_every_patch():
    """Two images, one of 10 x 10 patches (5 x 5 blocks: windows of 4 + a partial 1 at the right and bottom) and a
    video of two frames: every patch appears once; a window's patches share a frame and sit in one window x window
    square of blocks; frames never share a window."""
    grids = [(1, 10, 10), (2, 8, 12)]
    layout = vision_layout(grids, merge=2, window=4)
    assert sorted(layout.order.tolist()) == list(range(100 + 192))
    assert layout.frames.max() == 3 and len(np.unique(layout.windows)) == 4 + 2 * 2
    for window in np.unique(layout.windows):
        members = layout.windows == window
        assert len(np.unique(layout.frames[members])) == 1
        rows, cols = layout.positions[members, 0] // 2, layout.positions[members, 1] // 2
        assert rows.max() - rows.min() < 4 and cols.max() - cols.min() < 4 and rows.min() % 4 == cols.min() % 4 == 0
    sizes = sorted(int((layout.windows == w).sum()) // 4 for w in np.unique(layout.windows))
    assert sizes == [1, 4, 4, 8, 8, 16, 16, 16]  # blocks per window: the partial ones at the edges
    # restore takes the merged tokens back to the processor's order: row-major blocks of each frame
    first = layout.restore[:25]
    assert sorted(first.tolist()) == list(range(25)) and first.tolist() != list(range(25))


def test_both_key_layouts_load_and_another_architecture_is_refused_by_name():
    config, tensors = checkpoint("qwen2_5_vl")
    moved = {("model." + k if k.startswith("visual.") else k): v for k, v in tensors.items()}
    assert vision_tensors(moved, config).keys() == vision_tensors(tensors, config).keys()
    with pytest.raises(ConversionError, match="model_type 'llama' is not a native-resolution VLM"):
        vision_settings({**config, "model_type": "llama"})
    with pytest.raises(ConversionError, match="1 tensors this converter does not know, e.g. 'blocks.0.attn.extra'"):
        vision_tensors({**tensors, "visual.blocks.0.attn.extra": np.zeros(2)}, config)
