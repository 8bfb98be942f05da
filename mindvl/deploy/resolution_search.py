"""What test-time resolution search (mindvl/lite/resolution.py) gains on a data set: accuracy of the plain
answer, of each rule and of each view, on the test split as built and on a resized copy of it
(`resized_copy`): "canvas" (default) places each image at its own size in the centre of a canvas `scale`
times larger, filled with its border colour (the scene stays at its trained pixel size while the image
grows; after the plain resize it is `scale` times too small); "upscale" enlarges the whole image `scale`
times (the scene grows with it: the plain resize undoes that, a control where the search should not be
needed)."""
import dataclasses
import io
from typing import Dict, Optional, Sequence, Tuple

from PIL import Image

from mindvl import preprocess as P
from mindvl.data.reading.examples import query_examples
from mindvl.lite.device import DevicePipeline
from mindvl.lite.lite_model import LiteError
from mindvl.lite.resolution import DEFAULT_VIEWS, RULES, ResolutionSearch, border_colour

RESIZE_MODES = ("canvas", "upscale")


def resize_encoded(image: bytes, scale: int, mode: str = "canvas", name: str = "image") -> bytes:
    """The PNG bytes of one image made `scale` times larger by `mode` (module docstring)."""
    if mode not in RESIZE_MODES:
        raise LiteError(f"mode {mode!r}: expected one of {', '.join(RESIZE_MODES)}")
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise LiteError(f"scale {scale!r}: expected a whole number >= 1")
    img = P.open_image(image, name)
    width, height = img.size
    if mode == "upscale":
        out = img.resize((width * scale, height * scale), Image.BICUBIC)
    else:
        out = Image.new("RGB", (width * scale, height * scale), border_colour(img))
        out.paste(img, ((width * scale - width) // 2, (height * scale - height) // 2))
    buffer = io.BytesIO()
    out.save(buffer, format="PNG")
    return buffer.getvalue()


def resized_copy(examples: Sequence, scale: int = 4, mode: str = "canvas") -> list:
    """The examples with each image replaced by `resize_encoded(image, scale, mode)` (each distinct image is
    converted once); an image that cannot be decoded is kept as it is, to fail where the copy is used."""
    converted: Dict[bytes, bytes] = {}
    copies = []
    for example in examples:
        if example.image not in converted:
            try:
                converted[example.image] = resize_encoded(example.image, scale, mode)
            except P.InputError:
                converted[example.image] = example.image
        copies.append(dataclasses.replace(example, image=converted[example.image]))
    return copies


def image_size(image: bytes) -> Tuple[int, int]:
    return P.open_image(image).size


def resolution_report(package, root, scale: int = 4, mode: str = "canvas", views: Sequence[str] = DEFAULT_VIEWS,
                      modality: str = "typed", limit: int = 0, backend: str = "auto", temperature: float = 1.0,
                      pipeline: Optional[DevicePipeline] = None) -> Dict[str, object]:
    """The search's effect on the test split as built and on its resized copy: {"views", "modality",
    "scale", "mode", "image_size" (S), "data": [{"name", "size" (first image's width x height),
    "questions", "skipped", "accuracy": {plain, vote, max, mean, <view>...}}]}."""
    examples = query_examples(root, limit)
    if not examples:
        raise LiteError(f"{root}: the test split has no questions; build the data set first")
    copy = resized_copy(examples, scale, mode)
    own = pipeline is None
    pipeline = pipeline or DevicePipeline(package, backend)
    try:
        search = ResolutionSearch(pipeline, views, temperature=temperature)
        data = []
        for name, chosen in (("original", examples), (f"{mode} x{scale}", copy)):
            result = search.evaluate(chosen, modality)
            width, height = image_size(chosen[0].image)
            data.append({"name": name, "size": f"{width}x{height}", **result})
    finally:
        if own:
            pipeline.close()
    return {"views": list(views), "modality": modality, "scale": scale, "mode": mode,
            "image_size": pipeline.pre.image_size, "temperature": float(temperature), "data": data}


def format_resolution(report: Dict[str, object]) -> str:
    """The report as two tables: plain vs the rules, then each view."""
    def cell(value):
        return "-" if value is None else f"{value:.1%}"

    views = report["views"]
    first = report["data"][0]
    lines = [f"resolution search: {first['questions']} test questions ({report['modality']}), model input "
             f"{report['image_size']}x{report['image_size']}, views {', '.join(views)}", ""]
    width = max(len(f"{d['name']} ({d['size']})") for d in report["data"]) + 2
    columns = ["plain", *RULES]
    lines.append(f"{'data':<{width}}" + "".join(f"{c:>9}" for c in columns))
    for d in report["data"]:
        lines.append(f"{d['name'] + ' (' + d['size'] + ')':<{width}}"
                     + "".join(f"{cell(d['accuracy'][c]):>9}" for c in columns))
    lines += ["", f"{'accuracy per view':<{width}}" + "".join(f"{v:>11}" for v in views)]
    for d in report["data"]:
        lines.append(f"{d['name']:<{width}}" + "".join(f"{cell(d['accuracy'][v]):>11}" for v in views))
    skipped = [s for d in report["data"] for s in d["skipped"]]
    if skipped:
        lines += ["", f"{len(skipped)} questions skipped (bad input); first: {skipped[0]}"]
    return "\n".join(lines)
