"""`mindvl eval`: load a trained run and report VQA accuracy and retrieval Recall@K."""
import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mindspore as ms
from tqdm import tqdm

from mindvl.cells import AudioEmbedNet, ImageEmbedNet, TextEmbedNet, create_model
from mindvl.config import Config, config_from_dict
from mindvl.data.loader import split_inputs
from mindvl.eval.retrieval import audio_to_text, image_to_caption
from mindvl.eval.vqa import majority_baseline, vqa_accuracy
from mindvl.pretrained.tokens import token_cache
from mindvl.train.checkpoint import CheckpointError, load_model_weights, resolve_checkpoint
from mindvl.train.trainer import CONFIG_FILE


def find_run_config(checkpoint: Path) -> Path:
    """The run's config.json sits in the run folder, above checkpoints/step_*/model.safetensors."""
    for folder in [Path(checkpoint), *Path(checkpoint).parents][:5]:
        if (folder / CONFIG_FILE).is_file():
            return folder / CONFIG_FILE
    raise CheckpointError(f"{checkpoint}: no {CONFIG_FILE} found in it or its parent folders; "
                          f"pass the run folder written by `mindvl train`")


def load_trained(run: str, data_root: Optional[str] = None) -> Tuple[Config, Any]:
    """Rebuild the model of a training run and load its newest (or the named) checkpoint."""
    ms.set_context(mode=ms.GRAPH_MODE)
    weights = resolve_checkpoint(Path(run))
    cfg = config_from_dict(json.loads(find_run_config(weights).read_text()))
    if data_root:
        cfg.data.root = data_root
    model = create_model(cfg.model, cfg.preprocess)
    load_model_weights(model, weights)
    model.set_train(False)
    return cfg, model


def evaluate(cfg: Config, model, progress: bool = True) -> Dict[str, Any]:
    """VQA accuracy per question modality, retrieval Recall@K and the majority baseline on the test split.
    A run trained from cached frozen-encoder states (model.pretrained.cache) answers from the same cache,
    filled for the test inputs first."""
    start = time.perf_counter()
    tokens = token_cache(cfg, model)
    if tokens is not None:
        tokens.fill(model, *split_inputs(cfg, "test"), log=tqdm.write if progress else None, progress=progress)
    text_net = TextEmbedNet(model)
    report: Dict[str, Any] = {"baseline": majority_baseline(cfg)}
    for modality in ("text", "audio"):
        report[f"vqa_{modality}"] = vqa_accuracy(cfg, model, modality, progress, tokens)
    report["image_to_caption"] = image_to_caption(cfg, ImageEmbedNet(model), text_net)
    report["audio_to_text"] = audio_to_text(cfg, AudioEmbedNet(model), text_net)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report
