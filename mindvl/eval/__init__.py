"""Evaluation: VQA accuracy per question modality and cross-modal retrieval."""
from mindvl.eval.evaluate import evaluate, load_trained

__all__ = ["evaluate", "load_trained"]
