"""Linear probes on frozen features: what pretrained encoders give before any multimodal training.

A probe is ridge regression on standardised features, solved in closed form, its penalty chosen from
a grid on a held-out tenth of the training rows: to one-hot answers for VQA (the arg-max is the
prediction), or to the target text's embedding for retrieval (candidates ranked by cosine). Linear
in the concatenated features, a VQA probe cannot combine an image fact with a question ("is there a
red shape?"), which is the part fusion has to learn; it measures what each modality alone carries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

PENALTIES = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


@dataclass
class RidgeProbe:
    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray  # (features + 1, outputs), the last row the bias
    penalty: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, np.float64) - self.mean) / self.scale
        return np.concatenate([z, np.ones((len(z), 1))], axis=1) @ self.weight


def _solve(z: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    design = np.concatenate([z, np.ones((len(z), 1))], axis=1)
    regulariser = penalty * np.eye(design.shape[1])
    regulariser[-1, -1] = 0.0  # the bias is not penalised
    return np.linalg.solve(design.T @ design + regulariser, design.T @ y)


def fit_ridge(x: np.ndarray, y: np.ndarray, score: Callable[[RidgeProbe, np.ndarray], float],
              penalties: Sequence[float] = PENALTIES, holdout: float = 0.1, seed: int = 0) -> RidgeProbe:
    """Ridge regression x -> y. `score(probe, rows)` (higher is better) rates a probe fitted without
    `rows` (indices into x) on those rows; the best penalty is then refitted on every row."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-8
    z = (x - mean) / scale
    order = np.random.default_rng(seed).permutation(len(x))
    cut = max(1, int(len(x) * holdout))
    held, kept = order[:cut], order[cut:]
    best = max(penalties, key=lambda p: score(RidgeProbe(mean, scale, _solve(z[kept], y[kept], p), p), held))
    return RidgeProbe(mean, scale, _solve(z, y, best), best)


def classification_probe(x: np.ndarray, labels: np.ndarray, classes: int, **kwargs) -> RidgeProbe:
    """A linear classifier: ridge to one-hot labels, its penalty chosen by held-out accuracy."""
    labels = np.asarray(labels)
    return fit_ridge(x, np.eye(classes)[labels], lambda probe, rows: accuracy(probe, x[rows], labels[rows]), **kwargs)


def retrieval_probe(x: np.ndarray, targets: np.ndarray, candidates: np.ndarray, **kwargs) -> RidgeProbe:
    """A linear map from query features into the candidates' embedding space (targets: each query's
    candidate index), its penalty chosen by held-out Recall@1 over `candidates`."""
    targets = np.asarray(targets)
    return fit_ridge(x, candidates[targets],
                     lambda probe, rows: recall_at_1(probe, x[rows], targets[rows], candidates), **kwargs)


def accuracy(probe: RidgeProbe, x: np.ndarray, labels: np.ndarray) -> float:
    return float((probe.predict(x).argmax(axis=1) == np.asarray(labels)).mean())


def similarities(probe: RidgeProbe, x: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Cosine similarity of the mapped queries (n, d) with the candidates (m, d) -> (n, m)."""
    mapped = probe.predict(x)
    mapped /= np.maximum(np.linalg.norm(mapped, axis=1, keepdims=True), 1e-12)
    cand = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12)
    return mapped @ cand.T


def recall_at_1(probe: RidgeProbe, x: np.ndarray, targets: np.ndarray, candidates: np.ndarray) -> float:
    return float((similarities(probe, x, candidates).argmax(axis=1) == np.asarray(targets)).mean())
