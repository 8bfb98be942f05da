"""How well a caption describes its image, under a trained run's contrastive heads: the scorer that
`mindvl data build` hands to the data build's alignment filter (data.cleaning.align_checkpoint). It lives
above the data layer because it loads a model; the build only calls `score`."""
from pathlib import Path
from typing import Sequence

import mindspore as ms
import numpy as np

from mindvl import preprocess as P
from mindvl.cells import ImageEmbedNet, TextEmbedNet
from mindvl.errors import ConfigError
from mindvl.model_factory import load_model


class AlignmentScorer:
    """Cosine similarity of (image, caption) pairs under a trained mindvl run's contrastive heads.

    `checkpoint`: a run folder, a checkpoint folder or a model.safetensors (`mindvl.model_factory.load_model`).
    Images are decoded with the run's preprocess settings and captions tokenised with the tokenizer the
    run trained with (its data root's tokenizer.json), so the scores are the ones the run would give.
    """

    def __init__(self, checkpoint: str, batch_size: int = 64) -> None:
        try:
            self.cfg, model, _ = load_model(checkpoint)
        except (OSError, ValueError, RuntimeError) as exc:  # CheckpointError is a RuntimeError
            raise ConfigError(f"data.cleaning.align_checkpoint: cannot load {checkpoint!r} ({exc})") from exc
        path = Path(self.cfg.data.root) / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"data.cleaning.align_checkpoint: the run's tokenizer {path} is missing; the scorer "
                              f"needs the data root the run trained on")
        self.tokenizer = P.TextTokenizer.load(path)
        self.image_net, self.text_net = ImageEmbedNet(model), TextEmbedNet(model)
        self.batch_size = batch_size

    def _embed(self, net, arrays: Sequence[np.ndarray]) -> np.ndarray:
        out = []
        for start in range(0, len(arrays[0]), self.batch_size):
            out.append(net(*[ms.Tensor(a[start:start + self.batch_size]) for a in arrays]).asnumpy())
        emb = np.concatenate(out).astype(np.float64)
        return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def score(self, images: Sequence[bytes], captions: Sequence[str]) -> np.ndarray:
        """(N,) cosine similarities of images[i] with captions[i]."""
        if not len(images):
            return np.zeros(0)
        pre = self.cfg.preprocess
        pixels = np.stack([P.decode_image(data, pre, name=f"alignment image {i}") for i, data in enumerate(images)])
        distinct = sorted(set(captions))
        encoded = [self.tokenizer.encode(c, pre.max_text_length, name="caption") for c in distinct]
        text = self._embed(self.text_net, [np.stack([e[0] for e in encoded]), np.stack([e[1] for e in encoded])])
        index = {c: i for i, c in enumerate(distinct)}
        image = self._embed(self.image_net, [pixels.astype(np.float32)])
        return np.einsum("nd,nd->n", image, text[[index[c] for c in captions]])
