"""The generative model's evaluation: answer normalisation, the caption scorers, and `mindvl eval` on a
trained generative run (generated answers to typed and spoken test questions, descriptions, baseline)."""
import json

import pytest

from mindvl.eval.generated_answers import caption_scores, normalise_answer


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
    assert main(["eval", "--run", result.output_dir, "--limit", "1"]) == 0  # the first question of each kind
    first = json.loads(capsys.readouterr().out)
    assert first["vqa_text"]["count"] == first["vqa_audio"]["count"] == first["caption"]["count"] == 1


def test_the_fused_kernels_write_the_standard_operators_answers(generative_run):
    """`mindvl eval` generates with mindvl's CPU kernels swapped into the whole loaded model (the memory of
    MindSpore's operators in these graphs does not fit 16 prompts of vlm-s): the same tokens."""
    from mindvl.cells.kernels import fused_cells, library
    from mindvl.eval.generated_answers import GenerativeEvaluator
    from mindvl.model_factory import load_model

    if library() is None:
        pytest.skip("the fused CPU kernels cannot be built on this machine (no C++ compiler)")
    _, result = generative_run
    answers = {}
    for kernels in ("standard", "fused"):
        cfg, model, _ = load_model(result.output_dir)
        evaluator = GenerativeEvaluator(cfg, model, kernels=kernels)
        swapped = {module: any(isinstance(c, fused_cells()) for _, c in getattr(model, module).cells_and_names())
                   for module in ("vision", "audio", "decoder")}
        assert set(swapped.values()) == {kernels == "fused"}
        asked = evaluator.questions("test", 6)
        answers[kernels] = [a.tokens for a in evaluator.generator.generate([p for _, p in asked], max_new_tokens=6)]
    assert answers["fused"] == answers["standard"]
