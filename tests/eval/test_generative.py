"""The generative model's evaluation: answer normalisation, the caption scorers, and `mindvl eval` on a
trained generative run (generated answers to typed and spoken test questions, descriptions, baseline)."""
import json

import pytest

from mindvl.eval.generative import caption_scores, normalise_answer


def test_answers_are_compared_after_vqa_normalisation():
    assert normalise_answer("The Red.") == normalise_answer("red") == "red"
    assert normalise_answer("  a  blue   circle!") == "blue circle"
    assert normalise_answer("no") != normalise_answer("yes")


def test_caption_scores_reward_the_reference_and_not_another_caption():
    references = {0: ["a red circle next to a blue square"], 1: ["a green triangle on a white field"]}
    exact = caption_scores(references, {0: "A red circle next to a blue square.", 1: "a green triangle on a white field"})
    swapped = caption_scores(references, {0: "a green triangle on a white field", 1: "a red circle next to a blue square"})
    assert exact["bleu4"] == pytest.approx(1.0, abs=1e-3) and exact["cider_d"] > swapped["cider_d"]
    assert swapped["bleu4"] < 0.01


def test_mindvl_eval_scores_the_generated_answers_and_descriptions_of_a_generative_run(generative_run, capsys):
    from mindvl.cli import main

    _, result = generative_run
    assert main(["eval", "--run", result.output_dir]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vqa_text"]["count"] == report["vqa_audio"]["count"] > 0
    assert {"accuracy", "accuracy_yes/no"} <= set(report["vqa_text"])
    assert report["caption"]["count"] > 0 and report["caption"]["cider_d"] >= 0
    assert 0 <= report["caption"]["bleu4"] <= 1 and len(report["caption"]["examples"]) <= 3
    assert 0 < report["baseline"]["accuracy"] < 1
