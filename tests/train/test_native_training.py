"""Training a converted native-resolution VLM (the tiny Qwen2.5-VL, tests/references) on the small data set's typed
easy-VQA conversations and its two-image ones ("pair"), each image cut at its own resolution and the conversations packed with their M-RoPE
positions and their images on one vision sequence: LoRA on the frozen checkpoint stores only the adapters and names
the folder it was trained on, loads back and resumes exactly, and `mindvl lora merge` computes what the adapted
model does; the whole model fine-tuned learns the answers and generates them through mindvl.from_pretrained."""
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import mindvl
from conftest import assert_loads_back
from mindvl.config import load_config

REFERENCE = Path(__file__).parents[1] / "references" / "tiny_qwen2_5_vl"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from mindvl.pretrained.vlm import convert_vlm

    return convert_vlm(REFERENCE, tmp_path_factory.mktemp("vlm") / "qwen", log=lambda line: None)


def recipe(root, converted, out, *extra):
    from conftest import small_overrides

    return load_config("vlm-tiny", small_overrides(
        root, f"model.pretrained.vlm={converted}", "train.init_from=''", f"train.output_dir={out}",
        "train.warmup_steps=2", "train.eval_every=0", "data.conversation_kinds=[vqa, pair]", "train.kernels=fused", *extra))


def test_lora_stores_the_adapters_names_its_base_resumes_and_merges(small_cfg, small_report, converted, tmp_path,
                                                                    capsys):
    from mindvl.cli import main
    from mindvl.data.reading.native_conversations import NativeConversationStream
    from mindvl.model_factory import create_model, load_model
    from mindvl.runs import parameter_paths
    from mindvl.train import Trainer, TrainingArguments

    lora = ["model.decoder.lora_rank=4", "train.max_steps=6", "train.checkpoint_every=3", "train.log_every=3",
            "train.lr=5e-3", "data.validation_fraction=0.25", "train.eval_every=6"]
    cfg = recipe(small_cfg.data.root, converted, tmp_path / "run", *lora)
    model = create_model(cfg)
    result = Trainer(model, TrainingArguments(cfg, progress=False)).train()
    assert result.final_losses["lm"] < result.first_losses["lm"]
    # validation: the held-out images' typed questions answered by generation (the tower hears nothing)
    (validation,) = result.validation
    assert validation["step"] == 6 and "vqa_audio" not in validation
    assert validation["val_vqa"] == validation["vqa_text"] and result.best["step"] == 6
    step = Path(result.checkpoint)
    stored = load_file(str(step / "model.safetensors"))
    assert stored and all(".lora_" in name and name.startswith("decoder.") for name in stored)
    base = json.loads((step / "train_state.json").read_text())["base"]
    assert set(base) == {"tower", "decoder"} and base["tower"]["folder"] == str(converted.resolve())

    loaded = assert_loads_back(model, result.output_dir)

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(step.parent / "step_00000003", resumed_dir / "checkpoints" / "step_00000003")
    again_cfg = recipe(small_cfg.data.root, converted, resumed_dir, *lora)
    again = Trainer(create_model(again_cfg), TrainingArguments(again_cfg, resume="auto", progress=False)).train()
    assert again.start_step == 3
    for name, value in load_file(str(Path(again.checkpoint) / "model.safetensors")).items():
        np.testing.assert_array_equal(value, stored[name], err_msg=name)

    assert main(["lora", "merge", result.output_dir, "--out", str(tmp_path / "merged")]) == 0
    merged_cfg, merged, _ = load_model(tmp_path / "merged")
    assert merged_cfg.model.decoder.lora_rank == 0 and not merged_cfg.model.pretrained.vlm
    stream = NativeConversationStream(cfg)
    assert {"vqa", "pair"} <= set(stream.sizes.kinds[stream.rows].tolist())  # two-image conversations train too
    _, batch = next(iter(stream))
    loaded.set_train(False)
    np.testing.assert_allclose(merged(*batch[2:]).asnumpy(), loaded(*batch[2:]).asnumpy(), atol=1e-4)
    capsys.readouterr()
    import easy_vqa

    image = easy_vqa.get_train_image_paths()[0]
    assert main(["generate", "--model", str(tmp_path / "merged"), "what is it?", "--image", image,
                 "--max-new-tokens", "3"]) == 0  # the merged run: its own weights and tokenizer, no folder
    assert capsys.readouterr().err.strip() in ("[length]", "[stop]")

    # back to the ecosystem: the run written as its checkpoint's Hugging Face folder, LoRA merged; converted again
    # it generates what the run generates (tests/references/ref_qwen2_vl.py --written-back loads it in transformers)
    assert main(["export", "hf", result.output_dir, "--out", str(tmp_path / "hf")]) == 0
    written = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert written.keys() == load_file(str(REFERENCE / "model.safetensors")).keys()
    from mindvl.generation.native_generator import NativeGenerator
    from mindvl.pretrained.vlm import convert_vlm

    again = NativeGenerator.from_folder(convert_vlm(tmp_path / "hf", tmp_path / "again", log=lambda line: None), 256)
    run = mindvl.from_pretrained(result.output_dir, cache_len=256)
    prompts = [g.prompt("what is the shape?", images=[image]) for g in (again, run)]
    assert again.generate(prompts[0], max_new_tokens=8).tokens == run.generate(prompts[1], max_new_tokens=8).tokens
    np.testing.assert_allclose(written["model.layers.0.self_attn.q_proj.weight"],
                               dict(parameter_paths(merged))["decoder.blocks.0.attn.q_proj.weight"].asnumpy())


def test_fine_tuned_whole_it_answers_the_questions_it_was_trained_on(small_cfg, small_report, converted, tmp_path,
                                                                    capsys):
    """150 steps over the 8 training images' typed questions and pairs: the loss falls fivefold, `mindvl eval` reads the
    test split's typed questions and descriptions, and the run, opened by mindvl.from_pretrained as a NativeGenerator,
    answers more of the training questions than always saying the commonest answer."""
    import easy_vqa

    from mindvl.train import train

    cfg = recipe(small_cfg.data.root, converted, tmp_path / "run", "model.pretrained.freeze=false",
                 "train.max_steps=150", "train.lr=1e-2", "train.log_every=10", "train.checkpoint_every=150")
    result = train(cfg, progress=False)
    assert result.final_losses["lm"] < result.first_losses["lm"] / 5  # first and last 10 steps
    capsys.readouterr()
    from mindvl.cli import main

    assert main(["eval", "--run", result.output_dir, "--limit", "6"]) == 0  # the test split's typed questions
    report = json.loads(capsys.readouterr().out)
    assert report["vqa_text"]["count"] == 6 and "vqa_audio" not in report and report["caption"]["count"] > 0
    assert main(["eval", "--run", result.output_dir, "--limit", "6", "--weights", "int8"]) == 0  # its decoder int8
    quantized = json.loads(capsys.readouterr().out)
    assert quantized["weights"] == "int8" and quantized["quantized"]["layers"] > 0
    assert abs(quantized["vqa_text"]["accuracy"] - report["vqa_text"]["accuracy"]) <= 2 / 6  # the same questions
    generator = mindvl.from_pretrained(result.output_dir, cache_len=256)
    questions, answers, image_ids = easy_vqa.get_train_questions()
    paths = easy_vqa.get_train_image_paths()
    asked = [(q, a, paths[i]) for q, a, i in zip(questions, answers, image_ids) if i < 8]
    generated = generator.generate([generator.prompt(q, images=[path]) for q, _, path in asked], max_new_tokens=6)
    right = sum(g.text.strip() == a for g, (_, a, _) in zip(generated, asked))
    commonest = Counter(a for _, a, _ in asked).most_common(1)[0][1]
    assert right > commonest + 0.25 * (len(asked) - commonest), (right, commonest, len(asked))
