"""Native-resolution patches against transformers' slow Qwen2VLImageProcessor on real photos (scikit-image's
astronaut, coffee, chelsea and rocket, cut and scaled to several sizes and aspect ratios, stored with the
processor's outputs by tests/references/ref_qwen2_vl.py): the same grid and the same pixel values."""
import json
from pathlib import Path

import numpy as np
import pytest

from mindvl.errors import ConfigError, InputError
from mindvl.preprocess.native_resolution import (PatchConfig, VideoSampling, image_patches, read_video, smart_resize,
                                                 video_patches)

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


def test_a_video_keeps_an_even_count_of_frames_at_the_rate_within_the_bounds():
    sampling = VideoSampling()  # 2 frames a second, 4 to 768
    assert sampling.frame_count(300, 30.0) == 20  # 10 s
    assert sampling.frame_count(30, 30.0) == 4  # 1 s: at least 4
    assert sampling.frame_count(3, 30.0) == 2  # fewer frames than 4: all it has, even
    assert sampling.frame_count(30000, 30.0) == 768
    assert sampling.frame_count(25, 1.0) == 24  # odd -> even
    np.testing.assert_array_equal(sampling.indices(300, 30.0), np.round(np.linspace(0, 299, 20)))
    with pytest.raises(InputError, match="1 frame"):
        sampling.frame_count(1, 30.0)
    with pytest.raises(ConfigError, match="video fps"):
        VideoSampling(fps=0)
    # a long video's frames get fewer pixels: 2 x total / frames, never under 1.05 x the least
    assert sampling.patch_config(20, PatchConfig()).max_pixels == 768 * 28 * 28
    assert sampling.patch_config(768, PatchConfig()).max_pixels == int(128000 * 28 * 28 * 0.9 / 768 * 2)
    assert sampling.patch_config(768, PatchConfig()).min_pixels == 128 * 28 * 28
    assert VideoSampling.from_processor({"fps": 1, "size": {"shortest_edge": 3136, "longest_edge": 47040}}) == \
        VideoSampling(fps=1, min_pixels=3136, max_pixels=47040)


def test_a_video_file_is_decoded_once_keeping_the_sampled_frames(video_file, tmp_path):
    """A real MPEG-4 file (3 s at 10 fps, each frame a different grey) read back at 2 fps: 6 frames, each the grey
    of the frame its index names."""
    greys = np.linspace(20, 235, 30).astype(np.uint8)
    path = video_file(np.repeat(greys[:, None, None, None], 48 * 64 * 3, 1).reshape(30, 48, 64, 3), fps=10)
    sampling = VideoSampling(fps=2, min_pixels=3136, max_pixels=47040)
    frames, rate = read_video(path, sampling)
    kept = sampling.indices(30, 10.0)
    assert frames.shape == (6, 56, 56, 3) and rate == pytest.approx(2.0)  # resized as they are decoded
    assert np.abs(frames.mean(axis=(1, 2, 3)) - greys[kept]).max() < 4
    assert np.array_equal(read_video(path.read_bytes(), sampling)[0], frames)  # its bytes, as a server gets it
    with pytest.raises(InputError, match=r"6 frames of 56x56 take 48 patches, more than the 40"):
        read_video(path, sampling, max_patches=40)
    with pytest.raises(InputError, match="is not a readable video"):
        read_video(tmp_path / "none.mp4")
    with pytest.raises(InputError, match="the data is not a readable video"):
        read_video(b"not a video")
