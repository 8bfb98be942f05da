"""The deployable graphs of a model package: what each computes and its named, typed inputs and outputs.

One table (`graph_specs`) drives the writer, the manifest, the verifier and the package evaluation, so
a graph's interface is declared once. Shapes use -1 for the dynamic batch dimension; a static variant
replaces it with its batch size.
"""
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn

from mindvl.cells import AudioEmbedNet, ImageEmbedNet, TextEmbedNet, VQANet
from mindvl.cells.kernels import standard_kernels
from mindvl.config import PreprocessConfig
from mindvl.errors import PackageError

DTYPES = {"float32": (ms.float32, np.float32), "int32": (ms.int32, np.int32)}


@dataclass
class TensorSpec:
    name: str
    dtype: str  # a DTYPES key
    shape: Tuple[int, ...]  # -1: dynamic

    def with_batch(self, batch: int) -> "TensorSpec":
        """The batch axis (a dynamic first dimension) fixed to `batch`; a tensor without one is kept as it is (a
        native VLM's packed vision sequence and its tokens)."""
        if not self.shape or self.shape[0] >= 0:
            return self
        return TensorSpec(self.name, self.dtype, (batch, *self.shape[1:]))

    def placeholder(self) -> ms.Tensor:
        """The abstract input ms.export traces: None where the dimension is dynamic."""
        return ms.Tensor(shape=[None if d < 0 else d for d in self.shape], dtype=DTYPES[self.dtype][0])

    def to_dict(self) -> dict:
        return {**asdict(self), "shape": list(self.shape)}


@dataclass
class GraphSpec:
    name: str
    description: str
    build: Callable[[nn.Cell], nn.Cell]  # model -> the tensor-in, tensor-out cell to export
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]

    def static(self, batch: int) -> "GraphSpec":
        """The same graph with every batch dimension fixed to `batch` (devices that need static shapes)."""
        return GraphSpec(f"{self.name}_b{batch}", f"{self.description} (static batch {batch})", self.build,
                         [t.with_batch(batch) for t in self.inputs], [t.with_batch(batch) for t in self.outputs])


def question_inputs(pre: PreprocessConfig) -> List[TensorSpec]:
    """The VQA graph's inputs: preprocessed image, question as text ids and/or log-mel audio, and per
    sample which question modality the model should see (1 use, 0 ignore)."""
    text, frames = pre.max_text_length, pre.max_audio_frames
    return [
        TensorSpec("image", "float32", (-1, 3, pre.image_size, pre.image_size)),
        TensorSpec("question_ids", "int32", (-1, text)),
        TensorSpec("question_mask", "float32", (-1, text)),
        TensorSpec("audio_mel", "float32", (-1, pre.n_mels, frames)),
        TensorSpec("audio_mask", "float32", (-1, frames)),
        TensorSpec("use_text", "float32", (-1,)),
        TensorSpec("use_audio", "float32", (-1,)),
    ]


def graph_specs(pre: PreprocessConfig, embed_dim: int, num_answers: int, tokenizer) -> Dict[str, GraphSpec]:
    """Every deployable graph of a model, keyed by name; `tokenizer` gives the decoding's special ids."""
    inputs = question_inputs(pre)
    by_name = {t.name: t for t in inputs}
    steps = pre.max_answer_length - 1

    def embedding(name: str) -> List[TensorSpec]:
        return [TensorSpec(name, "float32", (-1, embed_dim))]

    specs = [
        GraphSpec("vqa", "image + question (text and/or audio) -> answer logits over `labels` and the greedily "
                         "generated answer token ids ([EOS] then [PAD] after the answer)",
                  lambda model: VQANet(model, pre.max_answer_length, tokenizer.bos_id, tokenizer.eos_id,
                                       tokenizer.pad_id),
                  inputs, [TensorSpec("answer_logits", "float32", (-1, num_answers)),
                           TensorSpec("answer_ids", "int32", (-1, steps))]),
        GraphSpec("image_embed", "image -> unit-length retrieval embedding", ImageEmbedNet,
                  [by_name["image"]], embedding("image_embedding")),
        GraphSpec("text_embed", "text ids + mask (captions or questions) -> unit-length retrieval embedding",
                  TextEmbedNet, [TensorSpec("text_ids", "int32", (-1, pre.max_text_length)),
                                 TensorSpec("text_mask", "float32", (-1, pre.max_text_length))],
                  embedding("text_embedding")),
        GraphSpec("audio_embed", "log-mel + frame mask -> unit-length retrieval embedding", AudioEmbedNet,
                  [by_name["audio_mel"], by_name["audio_mask"]], embedding("audio_embedding")),
    ]
    return {spec.name: spec for spec in specs}


def export_graph(net: nn.Cell, name: str, inputs: Sequence[TensorSpec], path: Path,
                 key: Optional[bytes] = None) -> Path:
    """ms.export `net` as MindIR at `path` (AES-GCM encrypted when `key` is given), with standard operators
    only; errors name the graph."""
    path = Path(path)
    options = {"enc_key": key, "enc_mode": "AES-GCM"} if key else {}
    try:
        with standard_kernels(net):  # a model trained with fused kernels exports MindSpore's operators
            ms.export(net, *(t.placeholder() for t in inputs), file_name=str(path.with_suffix("")),
                      file_format="MINDIR", **options)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise PackageError(f"graph {name}: MindIR export failed: {str(exc).strip().splitlines()[0]}") from exc
    split = path.with_name(f"{path.stem}_graph.mindir")  # over 1 GB of parameters MindSpore writes the graph
    if not path.is_file() and split.is_file():  # there and the weights in <stem>_variables/ (external data)
        split.rename(path)
    if not path.is_file():
        raise PackageError(f"graph {name}: ms.export wrote no {path.name}")
    return path
