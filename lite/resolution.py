"""Test-time resolution search: answer from several views of the image at the model's S x S input, combined.

The vqa graph takes S x S pixels (the manifest's preprocess.image_size); the server resizes the whole image
to S. An image far from the trained resolution then shows the model its objects at a scale it never saw:
a photo 4x larger than the training images in which the scene keeps its pixel size shrinks the scene to a
quarter after that resize. The search answers from a small grid of views instead:
  full     the whole image resized to S (the server's preprocessing, `decode_image`; the "plain" answer)
  crop:F   the centred square of side F * min(width, height), resized to S (zooms in when F < 1)
  pad:F    the whole image resized so its longer side is F * S, centred on an S x S canvas of its border
           colour (zooms out)
and combines their predictions by one rule:
  vote     the answer most views give; a tie goes to the tied answer with the highest summed confidence
  max      the answer of the single most confident view
  mean     the argmax of the views' averaged probabilities
Confidences are softmax(logits / temperature) (temperature from `mindvl lite calibrate`, default 1).

`mindvl.deploy.resolution_search.resolution_report` measures the effect on a data set's test split.
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl import preprocess as P
from mindvl.lite.calibration import example_item
from mindvl.lite.device import DevicePipeline, softmax
from mindvl.lite.lite_model import LiteError

DEFAULT_VIEWS = ("full", "crop:0.5", "crop:0.25", "pad:0.5")
RULES = ("vote", "max", "mean")


def parse_view(spec: str) -> Tuple[str, float]:
    """"full" -> ("crop", 1.0); "crop:0.5" -> ("crop", 0.5); "pad:0.5" -> ("pad", 0.5); F in (0, 1]."""
    if spec == "full":
        return "crop", 1.0
    kind, _, value = str(spec).partition(":")
    try:
        fraction = float(value)
    except ValueError:
        fraction = float("nan")
    if kind not in ("crop", "pad") or not 0 < fraction <= 1:
        raise LiteError(f"view {spec!r}: expected full, crop:F or pad:F with 0 < F <= 1 (e.g. crop:0.5)")
    return kind, fraction


def border_colour(img) -> Tuple[int, int, int]:
    """The median RGB of the image's outermost pixels: the background a zoomed-out view is padded with."""
    array = np.asarray(img)
    frame = np.concatenate([array[0], array[-1], array[:, 0], array[:, -1]])  # (2w + 2h, 3)
    return tuple(int(v) for v in np.median(frame, axis=0))


def view_image(img, spec: str, size: int):
    """One view (PIL RGB) of a PIL RGB image, at `size` x `size` except "full", which `image_to_array`
    resizes exactly as `decode_image` does."""
    from PIL import Image

    kind, fraction = parse_view(spec)
    width, height = img.size
    if kind == "crop":
        if fraction == 1.0:
            return img
        side = max(1, int(round(fraction * min(width, height))))
        left, top = (width - side) // 2, (height - side) // 2
        return img.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
    longest = max(1, int(round(fraction * size)))
    scale = longest / max(width, height)
    inner = img.resize((max(1, int(round(width * scale))), max(1, int(round(height * scale)))), Image.BICUBIC)
    canvas = Image.new("RGB", (size, size), border_colour(img))
    canvas.paste(inner, ((size - inner.size[0]) // 2, (size - inner.size[1]) // 2))
    return canvas


def combine(probabilities: np.ndarray, rule: str) -> Tuple[int, float]:
    """(answer index, its confidence) from the views' probabilities (views, classes) by `rule`; the
    confidence is the chosen view's (max), the averaged probability (mean) or the mean over the agreeing
    views of their confidence (vote)."""
    if rule not in RULES:
        raise LiteError(f"rule {rule!r}: expected one of {', '.join(RULES)}")
    best = probabilities.argmax(axis=1)
    confidence = probabilities.max(axis=1)
    if rule == "max":
        view = int(confidence.argmax())
        return int(best[view]), float(confidence[view])
    if rule == "mean":
        mean = probabilities.mean(axis=0)
        return int(mean.argmax()), float(mean.max())
    answers = np.unique(best)
    votes = np.array([(best == a).sum() for a in answers])
    weight = np.array([confidence[best == a].sum() for a in answers])
    winner = max(range(len(answers)), key=lambda i: (votes[i], weight[i]))
    return int(answers[winner]), float(weight[winner] / votes[winner])


@dataclasses.dataclass
class SearchAnswer:
    """answer / confidence: the combined prediction by `rule`; views: per view (spec, answer, confidence)."""
    answer: str
    confidence: float
    rule: str
    views: List[Tuple[str, str, float]]


class ResolutionSearch:
    """Answers from a grid of views (module docstring) with a DevicePipeline: one model row per view."""

    def __init__(self, pipeline: DevicePipeline, views: Sequence[str] = DEFAULT_VIEWS, rule: str = "vote",
                 temperature: float = 1.0) -> None:
        self.views = list(views)
        if not self.views:
            raise LiteError("views: expected at least one view (e.g. full)")
        for spec in self.views:
            parse_view(spec)
        if rule not in RULES:
            raise LiteError(f"rule {rule!r}: expected one of {', '.join(RULES)}")
        if not temperature > 0:
            raise LiteError(f"temperature {temperature!r}: expected a number > 0")
        self.pipeline, self.rule, self.temperature = pipeline, rule, float(temperature)

    def view_arrays(self, image: bytes, name: str = "image") -> np.ndarray:
        """float32 (views, 3, S, S): every view of the encoded image, normalised as in training."""
        img = P.open_image(image, name)
        size = self.pipeline.pre.image_size
        return np.stack([P.image_to_array(view_image(img, spec, size), self.pipeline.pre) for spec in self.views])

    def probabilities(self, image: bytes, question: Optional[str] = None, audio: Optional[bytes] = None,
                      name: str = "") -> np.ndarray:
        """float64 (views, classes): each view's softmax(logits / temperature) for the question."""
        return self._probabilities([(image, question, audio)], [name])[0]

    def _probabilities(self, requests: Sequence[tuple], names: Sequence[str]) -> List[np.ndarray]:
        """Per request, (views, classes) probabilities or its InputError; one model call for all rows."""
        rows, owners, results = [], [], []
        for index, ((image, question, audio), name) in enumerate(zip(requests, names)):
            try:
                row, _, _ = self.pipeline.prepare(image, question, audio, name)
                arrays = self.view_arrays(image, f"{name}image")
            except P.InputError as error:
                results.append(error)
                continue
            results.append(None)
            for array in arrays:
                rows.append({**row, "image": array})
                owners.append(index)
        if rows:
            logits, _ = self.pipeline.predict(rows)
            probabilities = softmax(logits, self.temperature)
            owners = np.asarray(owners)
            for index in np.unique(owners):
                results[index] = probabilities[owners == index]
        return results

    def answer(self, image: bytes, question: Optional[str] = None, audio: Optional[bytes] = None,
               rule: Optional[str] = None) -> SearchAnswer:
        """The combined answer to one question (InputError names a bad input)."""
        rule = rule or self.rule
        probabilities = self.probabilities(image, question, audio)
        index, confidence = combine(probabilities, rule)
        labels = self.pipeline.labels
        views = [(spec, labels[int(p.argmax())], float(p.max())) for spec, p in zip(self.views, probabilities)]
        return SearchAnswer(labels[index], confidence, rule, views)

    def evaluate(self, examples: Sequence, modality: str = "typed", batch: int = 32) -> Dict[str, object]:
        """Accuracy over labelled questions (QueryExample-like: image, question, audio, answer): "plain" (the
        full view: the server's answer; None when the grid has no full view), each rule, each view; bad
        items are skipped and listed."""
        labels = {label: i for i, label in enumerate(self.pipeline.labels)}
        correct = {key: 0 for key in ("plain", *RULES, *self.views)}
        plain = self.views.index("full") if "full" in self.views else None
        skipped: List[str] = []
        answered = 0
        for start in range(0, len(examples), batch):
            chunk = examples[start:start + batch]
            items = [example_item(e, modality) for e in chunk]
            requests = [(i["image"], i["question"], i["audio"]) for i in items]
            names = [f"item {start + k}: " for k in range(len(chunk))]
            for example, probabilities in zip(chunk, self._probabilities(requests, names)):
                if isinstance(probabilities, P.InputError):
                    skipped.append(str(probabilities))
                    continue
                truth = labels.get(example.answer, -1)
                answered += 1
                best = probabilities.argmax(axis=1)
                correct["plain"] += int(plain is not None and best[plain] == truth)
                for spec, view_best in zip(self.views, best):
                    correct[spec] += int(view_best == truth)
                for rule in RULES:
                    correct[rule] += int(combine(probabilities, rule)[0] == truth)
        accuracy = {key: (value / answered if answered else None) for key, value in correct.items()}
        if plain is None:
            accuracy["plain"] = None
        return {"questions": answered, "skipped": skipped, "accuracy": accuracy}
