"""Qwen2.5-VL and Qwen2-VL against transformers on tiny random checkpoints (tests/references/ref_qwen2_vl.py): the
native-resolution vision tower on one image (a partial window), two images of different sizes packed on one
sequence, a video of two temporal patches, also padded to a static bucket; the whole model's logits (the tower's
tokens in the prompt, M-RoPE positions) for those and for text alone (their 32 greedy tokens: test_vlm.py); the host
layout's windows and M-RoPE positions."""
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from safetensors.numpy import load_file

from mindvl.cells.decoder import CausalLM
from mindvl.cells.native_vision import NativeVisionTower
from mindvl.engine.vision_layout import mrope_positions, vision_layout
from mindvl.errors import ConversionError, InputError
from mindvl.pretrained.qwen2_vl import language_config, language_tensors, vision_settings, vision_tensors, vision_window

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
    cell = NativeVisionTower(**vision_settings(config))
    unloaded = ms.load_param_into_net(cell, {k: ms.Parameter(ms.Tensor(v), name=k)
                                             for k, v in vision_tensors(tensors, config).items()}, strict_load=True)
    assert unloaded == ([], [])
    return request.param, cell, vision_window(config)


@pytest.fixture(scope="module")
def language_model(tower):
    """The checkpoint's language model (Qwen2 with M-RoPE) as a CausalLM, its tensors set by name."""
    family = tower[0]
    config, tensors = checkpoint(family)
    cfg = language_config(config, REFERENCES / f"tiny_{family}")
    assert cfg.mrope_section == [2, 1, 1]
    lm = CausalLM(cfg)
    weights = language_tensors(tensors, cfg, REFERENCES / f"tiny_{family}")
    for name, param in lm.parameters_and_names():
        param.set_data(ms.Tensor(weights[name]))
    return lm, config, tensors["model.embed_tokens.weight"]


def prompt(tower, language_model, case):
    """The stored prompt's ids, its embeddings with the tower's tokens written over its image or video tokens, and
    its M-RoPE positions (3, L)."""
    family, cell, window = tower
    _, config, embedding = language_model
    ids = STORED[f"{family}_ids_{case}"]
    x = embedding[ids].copy()
    grids, steps = [], []
    if case != "text":
        pixels, grids = case_inputs(case)
        # Qwen2.5-VL's video time: 1 s per temporal patch (2 frames at 2 fps) x 2 tokens a second
        steps = [2.0 if family == "qwen2_5_vl" else 1.0] if case == "video" else [1.0] * len(grids)
        layout = vision_layout(grids, 2, window)
        x[np.isin(ids, [config["image_token_id"], config["video_token_id"]])] = \
            cell(*map(ms.Tensor, layout.graph_inputs(pixels))).asnumpy()[0]
    positions, _ = mrope_positions(ids, grids, [config["image_token_id"], config["video_token_id"]], 2, steps)
    return ids, x, positions


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


@pytest.fixture(scope="module")
def row_tower():
    """Qwen2.5-VL's tower whose windowed layers run one window a row (64 patches: 4 x 4 blocks of 2 x 2)."""
    config, tensors = checkpoint("qwen2_5_vl")
    window = vision_window(config)
    cell = NativeVisionTower(**vision_settings(config), window_row=window * window * 4)
    ms.load_param_into_net(cell, {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in vision_tensors(tensors, config).items()})
    return cell, window


@pytest.mark.parametrize("case", CASES)
def test_windows_laid_out_as_rows_give_the_same_tokens(row_tower, case):
    """Each window padded to a full row of empty patches (partial windows included), the windowed layers over
    rows, padded further to a bucket: transformers' tokens still."""
    cell, window = row_tower
    pixels, grids = case_inputs(case)
    layout = vision_layout(grids, 2, window, window_rows=True)
    assert layout.row == 64 and layout.patches % 64 == 0 and layout.patches > len(pixels)
    out = cell(*map(ms.Tensor, layout.graph_inputs(pixels, bucket=layout.patches + 128))).asnumpy()[0]
    np.testing.assert_allclose(out, STORED[f"qwen2_5_vl_vision_{case}"], atol=1e-5)


def test_padding_to_a_bucket_changes_no_token(tower):
    family, cell, window = tower
    pixels, grids = case_inputs("two_images")
    layout = vision_layout(grids, 2, window)
    padded = cell(*map(ms.Tensor, layout.graph_inputs(pixels, bucket=512))).asnumpy()[0]
    np.testing.assert_allclose(padded, STORED[f"{family}_vision_two_images"], atol=1e-5)


@pytest.mark.parametrize("case", [*CASES, "text"])
def test_the_whole_model_gives_transformers_logits(tower, language_model, case):
    """Every position's logits within 1e-4 of transformers' (the 32 greedy tokens after them, generated through the
    caches with each token at index + delta on every axis: tests/pretrained/test_vlm.py, all four cases batched)."""
    family = tower[0]
    lm = language_model[0]
    ids, x, positions = prompt(tower, language_model, case)
    valid = ms.Tensor(np.ones((1, len(ids)), bool))
    logits = lm.logits_embedded(ms.Tensor(x[None]), valid, ms.Tensor(positions.T[None].astype(np.int32))).asnumpy()[0]
    np.testing.assert_allclose(logits, STORED[f"{family}_logits_{case}"], atol=1e-4)


def test_mrope_positions_place_text_after_the_largest_position_and_check_the_runs():
    """Text counts on; an image of 1 x 4 x 6 patches (2 x 3 merged) sits at its grid from the run's start; a video
    of 2 temporal patches steps time by its time step; a run shorter than its grid is refused."""
    ids = [7, 7, 5, 5, 5, 5, 5, 5, 7, 6, 6, 6, 6, 7]
    positions, delta = mrope_positions(ids, [(1, 4, 6), (2, 2, 4)], [5, 6], merge=2, time_steps=[1.0, 2.5])
    assert positions[:, :2].tolist() == [[0, 1]] * 3
    assert positions[:, 2:8].tolist() == [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    assert positions[:, 8].tolist() == [5, 5, 5]
    assert positions[:, 9:13].tolist() == [[6, 6, 8, 8], [6, 6, 6, 6], [6, 7, 6, 7]]  # time 0, 2.5 -> 0, 2
    assert positions[:, 13].tolist() == [9, 9, 9] and delta == 10 - len(ids)
    with pytest.raises(InputError, match="its grid 1x4x8 makes 8 tokens, but the prompt's run of its token is "
                                         "shorter"):
        mrope_positions(ids, [(1, 4, 8), (2, 2, 4)], [5, 6])


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
