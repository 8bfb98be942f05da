"""`mindvl quickstart --config vlm-tiny`: the generative recipe's stages in order (tiny, then vlm-tiny from
its run), its evaluation and answers, at test size; the stage chains of the shipped generative recipes."""
import json

import pytest

from conftest import SMALL_MODEL, TEST_VOICES, TRAIN_VOICES


def test_a_generative_recipe_s_stages_are_found_from_its_init_from():
    from mindvl.errors import ConfigError
    from mindvl.quickstart.vlm import recipe_stages

    assert recipe_stages("vlm-tiny") == ["tiny", "vlm-tiny"]
    assert recipe_stages("vlm-s") == ["vlm-s-align", "vlm-s"]
    assert recipe_stages("vlm-s-native") == ["vlm-s-native-align", "vlm-s-native"]
    assert recipe_stages("vlm-tiny", ["train.init_from=''"]) == ["vlm-tiny"]
    with pytest.raises(ConfigError, match="train.init_from 'elsewhere/run' is not the run of a shipped recipe"):
        recipe_stages("vlm-tiny", ["train.init_from=elsewhere/run"])


@pytest.mark.slow
def test_the_generative_quickstart_trains_its_stages_evaluates_and_answers(tmp_path, capfd):
    from mindvl.cli import main

    overrides = ["data.limit=6", "data.batch_size=8", "data.num_workers=1", "train.warmup_steps=2",
                 "train.checkpoint_every=100", "data.speech_rates=[175]", "model.decoder.width=64",
                 f"data.train_voices=[{', '.join(TRAIN_VOICES)}]", f"data.test_voices=[{', '.join(TEST_VOICES)}]",
                 *SMALL_MODEL]
    work = tmp_path / "qs"
    args = ["quickstart", "--config", "vlm-tiny", "--workdir", str(work), "--max-steps", "12"]
    assert main([*args, *(arg for override in overrides for arg in ("--set", override))]) == 0
    out = capfd.readouterr().out  # the stages train in processes of their own
    for line in ("train tiny", "train vlm-tiny", "VQA, typed question", "VQA, spoken question", "majority baseline",
                 "descriptions", "answer"):
        assert line in out, out[-3000:]
    summary = json.loads((work / "summary.json").read_text())
    stages = summary["train"]
    assert [s["recipe"] for s in stages] == ["tiny", "vlm-tiny"] and all(s["steps"] == 12 for s in stages)
    assert [s["output_dir"] for s in stages] == [str(work / "tiny"), str(work / "vlm-tiny")]
    assert f"tensors from {work / 'tiny'}" in out  # stage 2 started from stage 1's weights
    typed = summary["eval"]["vqa_text"]
    assert typed["count"] > 0 and 0 <= typed["accuracy"] <= 1
    assert summary["eval"]["vqa_audio"]["count"] > 0 and summary["eval"]["caption"]["count"] > 0
    answers = summary["answers"]
    assert len(answers) == 4 and [a["question"] == "(spoken)" for a in answers] == [False, True, False, True]
    assert all(a["expected"] for a in answers)
    assert {"training_tiny.png", "training_vlm-tiny.png", "data_packing.png"} <= set(summary["plots"]["files"])
    assert all((work / "plots" / name).is_file() for name in summary["plots"]["files"])
