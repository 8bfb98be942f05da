"""Images: encoded bytes -> a normalised float32 (3, S, S) array, with the pixel limits every caller keeps.

RGB, bicubic resize to (image_size, image_size), [0, 1], then (x - mean) / std. An image is refused from its
header when it claims more than MAX_IMAGE_PIXELS or sides beyond MAX_ASPECT_RATIO (before a pixel is decoded),
and the decode budget (budget.py) bounds the pixels decoding at once in a process (a server's memory).
"""
from __future__ import annotations

import contextlib
import io
from functools import lru_cache
from typing import TYPE_CHECKING, ContextManager, Iterator, Tuple

import numpy as np

from mindvl.config import PreprocessConfig
from mindvl.errors import InputError, plain
from mindvl.preprocess.budget import decoding

if TYPE_CHECKING:  # PIL is imported lazily: the text-only paths never need it
    from PIL import Image

MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE  # 16.8 MP, refused from the header before decoding (_opened)
BYTES_PER_PIXEL = 8  # what Pillow holds while decoding: the decoded image and its RGB copy, 4 bytes a pixel each
# The longest side over the shortest, at most (Qwen2-VL's limit too). Resizing costs Pillow about 32 bytes per
# pixel of the longest side in filter coefficients: a 1 x 16,000,000 PNG of 31 KB took +810 MB to decode and
# resize; at 200:1 the largest image allowed (57,900 x 290) takes 2 MB of them.
MAX_ASPECT_RATIO = 200
MORE_PIXELS = f"more than the limit of {MAX_IMAGE_PIXELS:,} pixels"
RESIZE = f"resize it to at most {MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}"


def _decoding(source: Image.Image) -> ContextManager:
    """Hold the opened image's decoded bytes in the decode budget while it decodes (budget.py)."""
    width, height = source.size
    return decoding(width * height * BYTES_PER_PIXEL)


def decode_image(data: bytes, pre: PreprocessConfig, name: str = "image") -> np.ndarray:
    """Encoded image bytes (PNG, JPEG, ...) -> normalised float32 (3, S, S), S = pre.image_size.

    Decoded and resized holding its pixels in the decode budget (budget.py), released only once the
    full-size pixels are freed."""
    source = _opened(data, name)
    with _decoding(source):
        return image_to_array(_rgb(source, name), pre)


def open_image(data: bytes, name: str = "image") -> Image.Image:
    """Encoded image bytes -> a fully decoded PIL RGB image (truncated files fail here, not later).

    The training loader augments this image before `image_to_array`; serving goes through `decode_image`.
    The caller holds the image after its pixels leave the decode budget."""
    source = _opened(data, name)
    with _decoding(source):
        return _rgb(source, name)


def _opened(data: bytes, name: str) -> Image.Image:
    """`data` opened lazily (Pillow reads the header only), refused when it is empty, no image, or larger than
    MAX_IMAGE_PIXELS: before a pixel is decoded, as a 2 KB PNG can claim 20000x20000 (1.6 GB decoded)."""
    from PIL import Image

    if not data:
        raise InputError(f"{name}: empty image data; pass the bytes of a PNG or JPEG file")
    with _mapped_errors(name):
        source = Image.open(io.BytesIO(data))
    width, height = source.size
    if width * height > MAX_IMAGE_PIXELS:
        source.close()
        raise InputError(f"{name}: the image is {width}x{height} pixels, {MORE_PIXELS}; {RESIZE}")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        source.close()
        raise InputError(f"{name}: the image is {width}x{height} pixels, its sides more than {MAX_ASPECT_RATIO}:1; "
                         f"crop or pad it to a ratio within {MAX_ASPECT_RATIO}:1")
    return source


def _rgb(source: Image.Image, name: str) -> Image.Image:
    """The decoded RGB pixels of an opened image, which is closed (its own pixels freed)."""
    with source, _mapped_errors(name):
        return source.convert("RGB")  # convert() loads the pixels, so decoding errors surface here


@contextlib.contextmanager
def _mapped_errors(name: str) -> Iterator[None]:
    """Pillow's exceptions for undecodable bytes as an InputError naming the image and the fix."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except Image.DecompressionBombError as exc:  # Pillow's own limit, should it be set below ours
        raise InputError(f"{name}: the image holds {MORE_PIXELS} (Pillow: {exc}); {RESIZE}") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{name}: cannot decode the image ({plain(str(exc))}); pass a valid PNG or JPEG "
                         f"file") from exc


def resize_image(img: Image.Image, size: int) -> Image.Image:
    """Bicubic resize to (size, size) unless the image already is that size (then it is returned as is)."""
    from PIL import Image

    return img if img.size == (size, size) else img.resize((size, size), Image.BICUBIC)


def image_to_array(img: Image.Image, pre: PreprocessConfig) -> np.ndarray:
    """PIL RGB image -> normalised float32 (3, S, S): resize to S = pre.image_size if needed, scale to
    [0, 1], then (x - mean) / std."""
    array = np.asarray(resize_image(img, pre.image_size), dtype=np.float32)  # (S, S, 3)
    mean, std = _mean_std(tuple(pre.image_mean), tuple(pre.image_std))
    array = (array * (1.0 / 255.0) - mean) / std
    return np.ascontiguousarray(array.transpose(2, 0, 1))  # (3, S, S)


@lru_cache(maxsize=8)
def _mean_std(mean: Tuple[float, ...], std: Tuple[float, ...]) -> Tuple[np.ndarray, np.ndarray]:
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)
