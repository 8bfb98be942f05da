"""Structured pruning of a trained run: Taylor importance, head/channel slicing, and the fine-tuned run."""
import copy
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from mindvl.cells import AnswerNet, build_cells
from mindvl.cli import main
from mindvl.config import STACKS, PreprocessConfig
from mindvl.data import create_dataset
from mindvl.model_factory import load_model
from mindvl.export.graphs import question_inputs
from mindvl.export.package_writer import count_cell_parameters
from mindvl.package_reader import read_manifest
from mindvl.model_factory import merge_lora
from mindvl.train.prune import (RECORD_FILE, head_dim, importance, mlp_hidden,
                                 plan_pruning, prune_and_finetune, prune_model)

ANSWER_INPUTS = [spec.name for spec in question_inputs(PreprocessConfig())]


@pytest.fixture(scope="module")
def scored(trained_run):
    """(cfg, model, importance over 2 training batches) of the trained run."""
    _, result = trained_run
    cfg, model, _ = load_model(result.output_dir)
    return cfg, model, importance(cfg, model, batches=2)


@pytest.fixture(scope="module")
def question_batch(scored):
    return next(create_dataset(scored[0], "test", question_modality="both").create_dict_iterator(
        num_epochs=1, output_numpy=True))


def _answers(model, batch):
    return AnswerNet(model)(*[ms.Tensor(batch[name]) for name in ANSWER_INPUTS]).asnumpy()


def test_keeping_every_head_and_channel_only_permutes_them_and_answers_the_same(scored, question_batch):
    cfg, model, scores = scored
    plans = plan_pruning(cfg.model, scores, 1.0, 1.0)
    permuted = [plan.heads[layer] != sorted(plan.heads[layer]) for plan in plans.values()
                for layer in range(len(plan.heads))]
    assert any(permuted)  # importance order, not identity: the slicing is really exercised
    pruned_cfg, pruned = prune_model(cfg, model, scores, 1.0, 1.0)
    for stack in STACKS:
        before, after = getattr(cfg.model, stack), getattr(pruned_cfg.model, stack)
        assert (after.heads, after.head_dim, mlp_hidden(after)) == (before.heads, head_dim(before), mlp_hidden(before))
    assert count_cell_parameters(pruned) == count_cell_parameters(model)
    np.testing.assert_allclose(_answers(pruned, question_batch), _answers(model, question_batch), atol=1e-5)


def test_half_the_heads_and_channels_keeps_the_most_important_and_still_answers(scored, question_batch):
    cfg, model, scores = scored
    pruned_cfg, pruned = prune_model(cfg, model, scores, 0.5, 0.5)
    plans = plan_pruning(cfg.model, scores, 0.5, 0.5)
    removed = 0
    for stack in STACKS:
        before, after = getattr(cfg.model, stack), getattr(pruned_cfg.model, stack)
        size, width = head_dim(before), before.width
        assert (after.heads, after.head_dim, mlp_hidden(after)) == (before.heads // 2, size, mlp_hidden(before) // 2)
        removed += before.layers * ((before.heads - after.heads) * size * (3 * (width + 1) + width)
                                    + (mlp_hidden(before) - mlp_hidden(after)) * (2 * width + 1))
        for layer, (heads, channels) in enumerate(zip(plans[stack].heads, plans[stack].channels)):
            head_scores, channel_scores = scores[stack].heads[layer], scores[stack].channels[layer]
            assert head_scores[heads].min() >= np.delete(head_scores, heads).max()
            assert channel_scores[channels].min() >= np.delete(channel_scores, channels).max()
            prefix = f"{stack}.encoder.blocks.{layer}."
            original = dict(model.parameters_and_names())[prefix + "attn.q_proj.weight"].asnumpy()
            kept = dict(pruned.parameters_and_names())[prefix + "attn.q_proj.weight"].asnumpy()
            np.testing.assert_array_equal(kept, np.concatenate([original[h * size:(h + 1) * size] for h in heads]))
    assert removed > 0 and count_cell_parameters(pruned) == count_cell_parameters(model) - removed
    probabilities = _answers(pruned, question_batch)
    assert probabilities.shape == (cfg.data.batch_size, cfg.model.num_answers)
    assert np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)


def test_lora_must_be_merged_before_pruning_and_merging_folds_the_update(scored):
    cfg, model, scores = scored
    lora_cfg = copy.deepcopy(cfg)
    lora_cfg.model.text.lora_rank = 2
    with pytest.raises(ValueError, match="model.text: LoRA"):
        prune_model(lora_cfg, model, scores, 0.5, 0.5)
    lora_model = build_cells(lora_cfg.model, lora_cfg.preprocess)
    q_proj = lora_model.text.encoder.blocks[0].attn.q_proj
    q_proj.lora_b.set_data(ms.Tensor(np.ones(q_proj.lora_b.shape, np.float32)))
    merged_cfg, merged = merge_lora(lora_cfg, lora_model)
    assert merged_cfg.model.text.lora_rank == 0 and lora_cfg.model.text.lora_rank == 2
    expected = q_proj.weight.asnumpy() + q_proj.lora_scale * q_proj.lora_b.asnumpy() @ q_proj.lora_a.asnumpy()
    np.testing.assert_allclose(merged.text.encoder.blocks[0].attn.q_proj.weight.asnumpy(), expected, atol=1e-6)


def test_prune_and_finetune_writes_a_run_that_loads(trained_run, tmp_path):
    _, result = trained_run
    lines = []
    out = tmp_path / "pruned"
    record = prune_and_finetune(result.output_dir, str(out), keep_heads=0.5, keep_mlp=0.5, steps=2,
                                importance_batches=1, progress=False, log=lines.append)
    assert [line.split(" ")[1] for line in lines] == ["loaded", "importance", "vision", "fine-tuning", "done;"]
    assert json.loads((out / RECORD_FILE).read_text()) == json.loads(json.dumps(record))
    assert record["parameters"]["after"] < record["parameters"]["before"]
    assert record["finetune"]["steps"] == 2 and Path(record["finetune"]["checkpoint"]).is_dir()
    cfg, model, _ = load_model(str(out))
    for stack in STACKS:
        encoder = getattr(cfg.model, stack)
        assert (encoder.heads, encoder.head_dim) == (2, 8)  # trained_run: width 32, 4 heads of 8
        assert len(record["stacks"][stack]["kept_heads"][0]) == 2
    assert count_cell_parameters(model) == record["parameters"]["after"]
    with pytest.raises(ValueError, match="already holds checkpoints"):  # would mix with the pruned run's
        prune_and_finetune(result.output_dir, str(out), keep_heads=0.5, keep_mlp=0.5, steps=2)
    # `mindvl export prune` on a completed fine-tune packages it without pruning again
    package = tmp_path / "pkg"
    assert main(["export", "prune", "--checkpoint", str(result.output_dir), "--out", str(package), "--run-dir",
                 str(out), "--graph", "image_embed", "--no-eval"]) == 0
    manifest = read_manifest(package)
    assert manifest["compression"]["method"] == "pruned"
    assert manifest["compression"]["parameters"] == record["parameters"]
    assert manifest["parameters"] == record["parameters"]["after"]
