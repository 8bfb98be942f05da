"""`mindvl eval`: VQA accuracy and retrieval Recall@K of a model (from `mindvl.model_factory.load_model`) on the
test split."""
import time
from typing import Any, Dict

from mindvl.cells import AudioEmbedNet, ImageEmbedNet, TextEmbedNet
from mindvl.config import Config
from mindvl.data.reading.loader import split_inputs
from mindvl.eval.retrieval import audio_to_text, image_to_caption
from mindvl.eval.vqa import majority_baseline, vqa_accuracy
from mindvl.pretrained.tokens import token_cache
from mindvl.progress import log_line


def evaluate(cfg: Config, model, progress: bool = True) -> Dict[str, Any]:
    """VQA accuracy per question modality, retrieval Recall@K and the majority baseline on the test split.
    A run trained from cached frozen-encoder states (model.pretrained.cache) answers from the same cache,
    filled for the test inputs first."""
    start = time.perf_counter()
    tokens = token_cache(cfg, model)
    if tokens is not None:
        tokens.fill(model, *split_inputs(cfg, "test"), log=log_line if progress else None, progress=progress)
    text_net = TextEmbedNet(model)
    report: Dict[str, Any] = {"baseline": majority_baseline(cfg)}
    for modality in ("text", "audio"):
        report[f"vqa_{modality}"] = vqa_accuracy(cfg, model, modality, progress, tokens)
    report["image_to_caption"] = image_to_caption(cfg, ImageEmbedNet(model), text_net)
    report["audio_to_text"] = audio_to_text(cfg, AudioEmbedNet(model), text_net)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report
