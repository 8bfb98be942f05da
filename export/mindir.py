"""MindIR export of the answer graph, loading it back, and checking it answers as the framework does."""
from pathlib import Path
from typing import Dict, List, Mapping, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn

from mindvl.cells import AnswerNet
from mindvl.config import PreprocessConfig

ANSWER_INPUTS = ("image", "question_ids", "question_mask", "audio_mel", "audio_mask", "use_text", "use_audio")


def answer_input_specs(pre: PreprocessConfig) -> List[Tuple[str, Tuple[int, ...], ms.dtype.Type]]:
    """Names, shapes (batch dimension -1 = dynamic) and dtypes of the answer graph's inputs."""
    text, frames = pre.max_text_length, pre.max_audio_frames
    return [
        ("image", (-1, 3, pre.image_size, pre.image_size), ms.float32),
        ("question_ids", (-1, text), ms.int32),
        ("question_mask", (-1, text), ms.float32),
        ("audio_mel", (-1, pre.n_mels, frames), ms.float32),
        ("audio_mask", (-1, frames), ms.float32),
        ("use_text", (-1,), ms.float32),
        ("use_audio", (-1,), ms.float32),
    ]


def export_answer_graph(model: nn.Cell, pre: PreprocessConfig, path: Path) -> Path:
    """Write `path` (.mindir) holding image + question (text and/or audio) -> answer probabilities."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = AnswerNet(model)
    net.set_train(False)
    inputs = [ms.Tensor(shape=[None if d < 0 else d for d in shape], dtype=dtype)
              for _, shape, dtype in answer_input_specs(pre)]
    ms.export(net, *inputs, file_name=str(path.with_suffix("")), file_format="MINDIR")
    if not path.is_file():
        raise RuntimeError(f"ms.export did not write {path}")
    return path


def load_graph(path: Path) -> nn.GraphCell:
    """Load a MindIR file as a callable cell (no Python model code involved)."""
    return nn.GraphCell(ms.load(str(path)))


def verify_answer_graph(model: nn.Cell, graph: nn.GraphCell, batch: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """Run the in-framework answer net and the loaded graph on one real batch and compare."""
    inputs = [ms.Tensor(batch[name]) for name in ANSWER_INPUTS]
    expected = AnswerNet(model)(*inputs).asnumpy()
    loaded = graph(*inputs).asnumpy()
    return {
        "count": int(expected.shape[0]),
        "max_abs_diff": float(np.abs(expected - loaded).max()),
        "answers_equal": bool((expected.argmax(-1) == loaded.argmax(-1)).all()),
    }


def export_and_verify(cfg, model: nn.Cell, path: Path) -> Dict[str, object]:
    """Export the answer graph, load it back and compare it with the framework on a real test batch."""
    from mindvl.data import create_dataset

    path = export_answer_graph(model, cfg.preprocess, path)
    batch = next(create_dataset(cfg, "test", question_modality="both").create_dict_iterator(
        num_epochs=1, output_numpy=True))
    return {"path": str(path), **verify_answer_graph(model, load_graph(path), batch)}
