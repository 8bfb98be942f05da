"""Evaluation of a trained run: VQA per question modality, Recall@K, the majority baseline."""
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mindvl.data.records import read_table
from mindvl.eval import evaluate
from mindvl.eval.retrieval import recall_at_k
from mindvl.model_factory import load_model


def test_recall_at_k_counts_ranks():
    similarity = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.8], [0.5, 0.4, 0.1]])
    targets = np.array([0, 1, 2])  # ranks 0, 1, 2
    assert recall_at_k(similarity, targets, ks=(1, 2, 3)) == {"R@1": 1 / 3, "R@2": 2 / 3, "R@3": 1.0}


@pytest.fixture(scope="module")
def report(trained_run):
    _, result = trained_run
    cfg, model, _ = load_model(result.output_dir)
    return cfg, evaluate(cfg, model, progress=False)


def test_vqa_is_reported_per_question_modality_over_every_test_example(report):
    cfg, metrics = report
    test_rows = read_table(Path(cfg.data.root) / "test.mindrecord", ["answer_id"])
    for modality in ("vqa_text", "vqa_audio"):
        assert metrics[modality]["count"] == len(test_rows)
        for key, value in metrics[modality].items():
            if key.startswith(("accuracy", "generated")):
                assert 0.0 <= value <= 1.0


def test_majority_baseline_is_the_test_share_of_the_commonest_training_answer(report):
    cfg, metrics = report
    train = Counter(r["answer_id"] for r in read_table(Path(cfg.data.root) / "train.mindrecord", ["answer_id"]))
    test = Counter(r["answer_id"] for r in read_table(Path(cfg.data.root) / "test.mindrecord", ["answer_id"]))
    majority = train.most_common(1)[0][0]
    assert metrics["baseline"]["accuracy"] == pytest.approx(test[majority] / sum(test.values()))


def test_retrieval_ranks_distinct_items(report):
    cfg, metrics = report
    images = {r["image_id"] for r in read_table(Path(cfg.data.root) / "test.mindrecord", ["image_id"])}
    assert metrics["image_to_caption"]["queries"] == len(images)
    for task in ("image_to_caption", "audio_to_text"):
        assert 0.0 <= metrics[task]["R@1"] <= metrics[task]["R@5"] <= 1.0


def test_a_classifier_run_refuses_an_evaluation_limit_by_name(trained_run, capsys):
    """`mindvl eval --limit` bounds generated answers; a classifier's evaluation is one batched pass over the
    whole split, so a limit there is refused (exit 2) rather than silently ignored."""
    from mindvl.cli import main

    _, result = trained_run
    assert main(["eval", "--run", result.output_dir, "--limit", "2"]) == 2
    assert "is a classifier" in capsys.readouterr().err
