"""Evaluation: VQA accuracy per question modality and cross-modal retrieval of a built model."""
from mindvl.eval.evaluate import evaluate

__all__ = ["evaluate"]
