"""Native-resolution patches against transformers' slow Qwen2VLImageProcessor on real photos (scikit-image's
astronaut, coffee, chelsea and rocket, cut and scaled to several sizes and aspect ratios, stored with the
processor's outputs by tests/references/ref_qwen2_vl.py): the same grid and the same pixel values."""
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl.errors import ConfigError, InputError
from mindvl.preprocess.native_resolution import PatchConfig, image_patches, smart_resize, video_patches

REFERENCES = Path(__file__).parents[1] / "references"
STORED = np.load(REFERENCES / "qwen2_vl.npz")
PROCESSOR = json.loads((REFERENCES / "tiny_qwen2_5_vl" / "preprocessor_config.json").read_text())


@pytest.fixture(scope="module")
def config():
    return PatchConfig.from_processor(PROCESSOR)


@pytest.mark.parametrize("index", range(6))
def test_a_photo_gets_the_processors_grid_and_pixel_values(config, index):
    photo = STORED[f"photo_{index}"]
    pixels, grid = image_patches(photo, config)
    assert grid.tolist() == STORED[f"processed_{index}_grid"][0].tolist()
    np.testing.assert_array_equal(pixels, STORED[f"processed_{index}_pixels"])


def test_the_stored_photos_meet_both_pixel_bounds_and_several_aspect_ratios(config):
    """What the parity above covers: a photo scaled down to max_pixels, two scaled up to min_pixels, others
    resized to their nearest multiples, aspect ratios 1, 1.5 and 10."""
    counts = [int(np.prod(STORED[f"processed_{i}_grid"][0])) * config.patch_size ** 2 for i in range(6)]
    ratios = {round(max(p.shape[:2]) / min(p.shape[:2]), 1) for p in (STORED[f"photo_{i}"] for i in range(6))}
    assert config.max_pixels in counts and counts.count(config.min_pixels) == 2
    assert ratios == {1.0, 1.5, 10.0}


def test_smart_resize_keeps_multiples_of_28_within_the_bounds_and_refuses_200_to_1():
    config = PatchConfig(min_pixels=3136, max_pixels=28 * 28 * 1280)
    for height, width in [(1, 199), (28, 28), (1000, 1000), (4000, 3000), (50, 9000), (9000, 50)]:
        h, w = smart_resize(height, width, config)
        assert h % 28 == 0 and w % 28 == 0 and config.min_pixels <= h * w <= config.max_pixels, (height, width, h, w)
    with pytest.raises(InputError, match="upload: the image is 201x1 pixels, its sides more than 200:1"):
        smart_resize(1, 201, config, name="upload")


def test_a_video_pairs_its_frames_and_an_odd_frame_is_repeated(config):
    frames = STORED["video_frames"]
    pixels, grid = video_patches(frames, config)
    assert grid.tolist() == STORED["video_grid"][0].tolist() == [2, 8, 12]
    np.testing.assert_allclose(pixels, STORED["video_pixels"], atol=1e-6)  # the reference divides in float32
    odd, odd_grid = video_patches(frames[:3], config)
    assert odd_grid.tolist() == [2, 8, 12]
    np.testing.assert_array_equal(odd[96:], video_patches(np.stack([frames[2]] * 2), config)[0])


def test_a_processor_config_that_changes_the_pixels_otherwise_is_refused_by_key():
    with pytest.raises(ConfigError, match="preprocessor_config.json: resample=2; only 3"):
        PatchConfig.from_processor({**PROCESSOR, "resample": 2})
    with pytest.raises(ConfigError, match="patches.min_pixels \\(5000\\) exceeds patches.max_pixels \\(4000\\)"):
        PatchConfig(min_pixels=5000, max_pixels=4000)
