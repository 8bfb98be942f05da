"""Images and videos at their own resolution, as the Qwen2-VL / Qwen2.5-VL family's vision tower takes them: each
side resized to a multiple of patch x merge (28) with the pixel count between two bounds (`smart_resize`), then cut
into flattened patches of temporal_patch x 3 x 14 x 14 values in merge-block order (`patches`). An image is one
frame repeated to fill a temporal patch; a video's frames pair up.

The arithmetic is transformers' slow `Qwen2VLImageProcessor` (Pillow's bicubic resize of the uint8 RGB pixels,
x / 255 in float64 then float32, (x - mean) / std in float32), so the pixel values are identical to its (tested on
real photos at several sizes and aspect ratios). The fast (torchvision) processor resizes differently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Sequence, Tuple, Union

import numpy as np

from mindvl.errors import ConfigError, InputError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200  # the family's processor refuses more elongated images


@dataclass(frozen=True)
class PatchConfig:
    """How a native-resolution tower cuts images: patch side, frames per temporal patch, the merger's block
    side, the pixel-count bounds after resizing, and the normalisation (a checkpoint's preprocessor_config.json)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: Tuple[float, ...] = CLIP_MEAN
    image_std: Tuple[float, ...] = CLIP_STD

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"patches.{name}: expected a positive integer, got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"patches.min_pixels ({self.min_pixels}) exceeds patches.max_pixels ({self.max_pixels})")
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ConfigError("patches.image_mean and image_std: expected 3 values each (R, G, B)")

    @property
    def factor(self) -> int:
        """What each resized side is a multiple of: a merged block of patches."""
        return self.patch_size * self.merge_size

    @property
    def patch_values(self) -> int:
        """Values in one flattened patch: 3 x temporal_patch_size x patch_size^2 (1176 for the family)."""
        return 3 * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_processor(cls, recorded: dict) -> "PatchConfig":
        """From a Hugging Face preprocessor_config.json (Qwen2VLImageProcessor's keys; min/max pixels from `size`
        when absent); keys that change the pixels and that this cannot follow are refused by name."""
        size = recorded.get("size") or {}
        values = {"min_pixels": recorded.get("min_pixels", size.get("shortest_edge")),
                  "max_pixels": recorded.get("max_pixels", size.get("longest_edge")),
                  **{f.name: recorded.get(f.name) for f in fields(cls) if f.name not in ("min_pixels", "max_pixels")}}
        for key, expected in (("do_resize", True), ("do_rescale", True), ("do_normalize", True), ("resample", 3),
                              ("rescale_factor", 1 / 255)):
            if key in recorded and recorded[key] != expected:
                raise ConfigError(f"preprocessor_config.json: {key}={recorded[key]!r}; only {expected!r} (the "
                                  f"family's processor) is supported")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if v is not None})


def smart_resize(height: int, width: int, config: PatchConfig = PatchConfig(), name: str = "image") -> Tuple[int, int]:
    """The (height, width) an image is resized to: each side a multiple of config.factor, as close to the
    original's as rounding allows, scaled down to at most max_pixels or up to at least min_pixels keeping the
    aspect ratio. InputError naming `name` for an image more elongated than 200:1."""
    if min(height, width) < 1:
        raise InputError(f"{name}: an image of {width}x{height} pixels has no pixels")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise InputError(f"{name}: the image is {width}x{height} pixels, its sides more than {MAX_ASPECT}:1 (the "
                         f"model's processor refuses it); crop or pad it to a ratio within {MAX_ASPECT}:1")
    factor = config.factor
    resized_h, resized_w = round(height / factor) * factor, round(width / factor) * factor
    if resized_h * resized_w > config.max_pixels:
        beta = math.sqrt(height * width / config.max_pixels)
        resized_h = max(factor, math.floor(height / beta / factor) * factor)
        resized_w = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_h * resized_w < config.min_pixels:
        beta = math.sqrt(config.min_pixels / (height * width))
        resized_h, resized_w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return resized_h, resized_w


def normalised(pixels: np.ndarray, config: PatchConfig) -> np.ndarray:
    """uint8 (..., H, W, 3) -> float32 (..., 3, H, W): x / 255, then (x - mean) / std, as the processor rounds."""
    scaled = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)
    scaled = (scaled - np.asarray(config.image_mean, np.float32)) / np.asarray(config.image_std, np.float32)
    return np.moveaxis(scaled, -1, -3)


def resized(image, config: PatchConfig = PatchConfig(), name: str = "image") -> np.ndarray:
    """A PIL image or uint8 (H, W, 3) array -> uint8 (h, w, 3) at its smart_resize size (Pillow bicubic)."""
    from PIL import Image

    picture = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, np.uint8))
    picture = picture.convert("RGB")
    height, width = smart_resize(picture.height, picture.width, config, name)
    if (height, width) != (picture.height, picture.width):
        picture = picture.resize((width, height), Image.BICUBIC)
    return np.asarray(picture)


def patches(frames: np.ndarray, config: PatchConfig = PatchConfig()) -> Tuple[np.ndarray, np.ndarray]:
    """Normalised frames float32 (T, 3, H, W), H and W multiples of config.factor -> (flattened patches float32
    (t * h * w, patch_values), grid int64 (t, h, w)) in merge-block order: the patches of each merge x merge block
    consecutive, blocks row by row. T is padded to a multiple of temporal_patch_size by repeating the last frame."""
    count, channels, height, width = frames.shape
    step, side, merge = config.temporal_patch_size, config.patch_size, config.merge_size
    if height % config.factor or width % config.factor:
        raise InputError(f"frames of {width}x{height}: each side must be a multiple of {config.factor}; resize them "
                         f"with smart_resize first")
    if count % step:
        frames = np.concatenate([frames, np.repeat(frames[-1:], step - count % step, axis=0)])
    grid_t, grid_h, grid_w = len(frames) // step, height // side, width // side
    blocks = frames.reshape(grid_t, step, channels, grid_h // merge, merge, side, grid_w // merge, merge, side)
    flat = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(grid_t * grid_h * grid_w, config.patch_values)
    return np.ascontiguousarray(flat), np.array([grid_t, grid_h, grid_w], np.int64)


def image_patches(image, config: PatchConfig = PatchConfig(), name: str = "image") -> Tuple[np.ndarray, np.ndarray]:
    """One image (PIL, or uint8 (H, W, 3)) -> its patches and grid (1, h, w): resized, normalised, its frame
    repeated to fill a temporal patch."""
    return patches(normalised(resized(image, config, name), config)[None], config)


def video_patches(frames: Union[np.ndarray, Sequence], config: PatchConfig = PatchConfig(),
                  name: str = "video") -> Tuple[np.ndarray, np.ndarray]:
    """Frames (uint8 (T, H, W, 3), or a list of images, all one size) -> patches and grid (T / 2, h, w), every
    frame resized to the first's smart_resize size."""
    pictures = [resized(frame, config, f"{name} frame {i}") for i, frame in enumerate(frames)]
    sizes = {p.shape for p in pictures}
    if len(sizes) != 1:
        raise InputError(f"{name}: frames of several sizes ({sorted(sizes)}); give every frame the same size")
    return patches(normalised(np.stack(pictures), config), config)


@dataclass(frozen=True)
class VideoSampling:
    """How a video becomes frames (the family's video rule, qwen-vl-utils): `fps` frames a second, their count
    even and between min_frames and max_frames (and at most the video's), spread evenly over it; each frame's
    pixels between min_pixels and the larger of 1.05 x min_pixels and min(max_pixels, 2 x total_pixels / frames):
    a long video gets smaller frames, so its tokens stay bounded."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    total_pixels: int = int(128000 * 28 * 28 * 0.9)

    def __post_init__(self) -> None:
        if not (isinstance(self.fps, (int, float)) and not isinstance(self.fps, bool) and 0 < self.fps <= 60):
            raise ConfigError(f"video fps: expected a number in (0, 60], got {self.fps!r}")
        if not 2 <= self.min_frames <= self.max_frames:
            raise ConfigError(f"video frames: expected 2 <= min_frames ({self.min_frames}) <= max_frames "
                              f"({self.max_frames})")

    @classmethod
    def from_processor(cls, recorded: dict) -> "VideoSampling":
        """From a Hugging Face video_preprocessor_config.json (fps, frame bounds, pixel bounds, the latter also as
        `size`'s shortest_edge / longest_edge); absent keys keep the family's defaults."""
        size = recorded.get("size") or {}
        values = {"fps": recorded.get("fps"), "min_frames": recorded.get("min_frames"),
                  "max_frames": recorded.get("max_frames"),
                  "min_pixels": recorded.get("min_pixels", size.get("shortest_edge")),
                  "max_pixels": recorded.get("max_pixels", size.get("longest_edge"))}
        return cls(**{k: v for k, v in values.items() if v is not None})

    def frame_count(self, total: int, source_fps: float) -> int:
        """How many of a video's `total` frames (at `source_fps`) are kept: even, at least 2."""
        lowest = math.ceil(self.min_frames / 2) * 2
        highest = math.floor(min(self.max_frames, total) / 2) * 2
        wanted = min(max(total / source_fps * self.fps, lowest), highest, total)
        count = math.floor(wanted / 2) * 2
        if count < 2:
            raise InputError(f"video: {total} frame(s); the model takes at least 2 (a temporal patch)")
        return count

    def indices(self, total: int, source_fps: float) -> np.ndarray:
        """The kept frames' indices: evenly spaced from the first to the last, rounded."""
        return np.round(np.linspace(0, total - 1, self.frame_count(total, source_fps))).astype(np.int64)

    def patch_config(self, frames: int, config: PatchConfig) -> PatchConfig:
        """`config` with the pixel bounds of a video of `frames` frames."""
        import dataclasses

        highest = max(min(self.max_pixels, self.total_pixels / frames * 2), self.min_pixels * 1.05)
        return dataclasses.replace(config, min_pixels=self.min_pixels, max_pixels=int(highest))


def read_video(source, sampling: VideoSampling = VideoSampling(), config: PatchConfig = PatchConfig(),
               name: str = "video", max_patches: int = 0) -> Tuple[np.ndarray, float]:
    """A video (a file's path, or its bytes) -> its kept frames, uint8 (n, h, w, 3) each already at the video's
    smart_resize size, and the rate they were kept at (frames a second). PyAV reads the header first: a frame
    larger than MAX_IMAGE_PIXELS, or (max_patches > 0) kept frames that would take more patches, are refused
    before a frame is decoded; then it decodes once, converting and resizing only the kept frames. InputError
    naming `name` for what it cannot read."""
    import io

    import av

    from mindvl.preprocess.image import MAX_IMAGE_PIXELS

    opened = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)
    what = "the data" if isinstance(source, (bytes, bytearray)) else str(source)
    try:
        with av.open(opened) as container:
            if not container.streams.video:
                raise InputError(f"{name}: {what} holds no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if not width or not height or width * height > MAX_IMAGE_PIXELS:
                raise InputError(f"{name}: frames of {width}x{height} pixels; send frames of at most "
                                 f"{MAX_IMAGE_PIXELS:,} pixels")
            source_fps = float(stream.average_rate or stream.guessed_rate or sampling.fps)
            total = stream.frames or 0
            if total <= 0:  # the container does not say: count them
                total = sum(1 for _ in container.demux(stream) if _.size)
                container.seek(0)
            keep = sampling.indices(total, source_fps)
            frame_config = sampling.patch_config(len(keep), config)
            side_h, side_w = smart_resize(height, width, frame_config, name)
            patches_needed = -(-len(keep) // config.temporal_patch_size) * side_h * side_w // config.patch_size ** 2
            if max_patches and patches_needed > max_patches:
                raise InputError(f"{name}: {len(keep)} frames of {side_w}x{side_h} take {patches_needed:,} patches, "
                                 f"more than the {max_patches:,} this model takes; send a shorter video or a lower "
                                 f"fps")
            wanted, frames = set(keep.tolist()), {}
            for index, frame in enumerate(container.decode(stream)):
                if index in wanted:
                    frames[index] = resized(frame.to_image(), frame_config, f"{name} frame {index}")
                if index >= keep[-1]:
                    break
    except InputError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise InputError(f"{name}: {what} is not a readable video ({exc})") from exc
    if not frames:
        raise InputError(f"{name}: {what} has no decodable frame")
    kept_fps = len(keep) / (total / source_fps) if total else sampling.fps
    return np.stack([frames[i] for i in keep if i in frames]), kept_fps


IMAGE, VIDEO = "image", "video"  # an attachment's kind


def attachments(images: Sequence = (), video=None, config: PatchConfig = PatchConfig(),
                sampling: VideoSampling = VideoSampling(), tokens_per_second: float = 0.0, fps=None,
                max_patches: int = 0) -> list:
    """A question's attachments as a native-resolution model takes them: (kind, patches, grid, time step) per image
    (PIL images or uint8 arrays, in order) and for the video (a file's path or bytes, sampled at `fps` or the
    sampling's; or its frames, a list of images taken `fps` apart). The time step is M-RoPE's between a video's
    temporal patches: Qwen2.5-VL counts seconds (tokens_per_second x the seconds a temporal patch spans),
    Qwen2-VL (tokens_per_second 0) counts patches."""
    import dataclasses

    found = [(IMAGE, *image_patches(image, config, f"images[{i}]"), 1.0) for i, image in enumerate(images)]
    if video is not None:
        sampling = sampling if fps is None else dataclasses.replace(sampling, fps=fps)
        if isinstance(video, (str, bytes, bytearray)) or hasattr(video, "__fspath__"):
            frames, rate = read_video(video, sampling, config, max_patches=max_patches)
        else:
            frames, rate = list(video), sampling.fps
            if not frames:
                raise InputError("video: no frames")
            if len(frames) > sampling.max_frames:
                frames = [frames[i] for i in sampling.indices(len(frames), rate)]
        pixels, grid = video_patches(frames, sampling.patch_config(len(frames), config))
        step = tokens_per_second * config.temporal_patch_size / rate if tokens_per_second else 1.0
        found.append((VIDEO, pixels, grid, step))
    return found
